"""Shared pieces of the benchmarks: timing, results with targets, the table, machine info.

Every figure a target is checked on is a *ratio* against a baseline measured in the same
run (the machines this runs on are shared and noisy; absolute times are only context).
"""

from __future__ import annotations

import dataclasses
import datetime
import math
import os
import platform
import statistics
import time
from typing import Optional

import torch


@dataclasses.dataclass
class Result:
    """One benchmark figure, optionally checked against a target."""

    area: str                     # e.g. "forget-mult", "layer", "checkpoint", "train", "cuda"
    name: str                     # what was measured, with its shape
    value: float                  # the figure (usually a ratio)
    unit: str = "x"               # "x" for ratios, "%" for fractions, "ms", "GB/s" ...
    target: Optional[str] = None  # human-readable target, e.g. ">= 20x"
    met: Optional[bool] = None    # None when the figure has no target
    note: str = ""                # context: the absolute times behind a ratio, what limits it
    # Optional numbers behind the figure for the plots, e.g. {"qrnn (GB/s)": 41.2, "copy (GB/s)": 55.0}:
    # `python -m qrnn.bench --plots DIR` draws them as grouped bars, the unit taken from "(...)".
    series: dict = dataclasses.field(default_factory=dict)

    def row(self) -> list:
        status = "" if self.met is None else ("met" if self.met else "NOT met")
        value = format_number(self.value) + self.unit if math.isfinite(self.value) else "n/a"
        return [self.area, self.name, value, self.target or "", status, self.note]


def format_number(value: float) -> str:
    """`value` with 3 significant digits, never in scientific notation ("0.00432", "897",
    "28,900"); "n/a" for NaN or infinity (a figure not measured: the note says why)."""
    if not math.isfinite(value):
        return "n/a"
    if value == 0 or abs(value) >= 100:
        return f"{value:,.0f}"
    decimals = 2 - math.floor(math.log10(abs(value)))
    text = f"{value:.{decimals}f}"
    return text.rstrip("0").rstrip(".") if "." in text else text


# A copy of a quick run's small shape lasts microseconds: what it times is the call's
# overhead (waking the thread pool, a neighbour's time slice), not memory bandwidth, so a
# bandwidth share against it is no figure (it read 897% or 28,900% on a busy 2-core machine).
QUICK_COPY_NOTE = "n/a in --quick: a copy this small times per-call overhead, not bandwidth; "


def copy_share(copy_seconds: float, op_seconds: float, quick: bool) -> float:
    """Percent of a copy's bandwidth an op achieves over the same bytes; NaN (printed n/a,
    with :data:`QUICK_COPY_NOTE`) in a quick run, whose shapes are too small to measure it."""
    return math.nan if quick else 100 * copy_seconds / op_seconds


def sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def measure_interleaved_samples(fns: dict, *, device: str = "cpu", rounds: int = 7, repeat: int = 5,
                                warmup: int = 2) -> dict:
    """Seconds per call of each named fn in every round (a list per name, one entry per
    round), timed in interleaved rounds so that a noisy neighbour slows every contender alike
    rather than whichever ran at the wrong moment; round i of each fn ran back to back."""
    for fn in fns.values():
        for _ in range(warmup):
            fn()
    sync(device)
    samples: dict[str, list[float]] = {name: [] for name in fns}
    for _ in range(rounds):
        for name, fn in fns.items():
            start = time.perf_counter()
            for _ in range(repeat):
                fn()
            sync(device)
            samples[name].append((time.perf_counter() - start) / repeat)
    return samples


def measure_interleaved(fns: dict, *, device: str = "cpu", rounds: int = 7, repeat: int = 5,
                        warmup: int = 2) -> dict:
    """Median seconds per call for each named fn (see measure_interleaved_samples)."""
    samples = measure_interleaved_samples(fns, device=device, rounds=rounds, repeat=repeat, warmup=warmup)
    return {name: statistics.median(s) for name, s in samples.items()}


def round_ratios(samples: dict, num: str, den: str) -> tuple:
    """(median, lowest, highest) over the rounds of samples[num][i] / samples[den][i]: a ratio
    of two interleaved contenders with its run-to-run spread."""
    ratios = [n / d for n, d in zip(samples[num], samples[den])]
    return statistics.median(ratios), min(ratios), max(ratios)


def machine_info() -> dict:
    """Where and with what the figures were measured: recorded beside every result table."""
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as fh:
            for line in fh:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    import qrnn

    build = qrnn.build_info()
    info = {
        "date": datetime.date.today().isoformat(),
        "cpu": cpu,
        "cores": os.cpu_count(),
        "torch threads": torch.get_num_threads(),
        "gpu": torch.cuda.get_device_name() if torch.cuda.is_available() else "none",
        "python": platform.python_version(),
        "torch": torch.__version__,
        "qrnn": qrnn.__version__,
        "compiler": build["compiler"],
        "simd": build["simd"],
        "cuda kernels": build["cuda_architectures"] if build["cuda"] else "not built",
    }
    return info


def format_table(results: list) -> str:
    header = ["area", "figure", "value", "target", "status", "note"]
    rows = [header] + [r.row() for r in results]
    widths = [max(len(str(row[i])) for row in rows) for i in range(len(header))]
    lines = ["  ".join(str(c).ljust(w) for c, w in zip(row, widths)).rstrip() for row in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def markdown_table(results: list) -> str:
    lines = ["| figure | value | target | status | note |", "|---|---|---|---|---|"]
    for r in results:
        _, name, value, target, status, note = r.row()
        lines.append(f"| {name} | {value} | {target} | {status} | {note} |")
    return "\n".join(lines)
