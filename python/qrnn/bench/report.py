"""The benchmark report: BENCHMARKS.md sections and PNG plots from a run's results.

BENCHMARKS.md holds one section per area between marker comments. Writing replaces the
sections of the areas that ran and keeps the others (each section records its own machine,
date and versions), so areas may be measured in separate runs, or on different machines.
"""

from __future__ import annotations

import json
import math
import os
import re
import textwrap
from typing import Optional

from .common import Result, format_number, markdown_table

_BEGIN = re.compile(r"<!-- qrnn-bench:begin (?P<area>[\w.-]+) (?P<meta>\{.*?\}) -->")
_END = "<!-- qrnn-bench:end {area} -->"
# A hand-written block (conditions of the run, what limits a missed target) that every
# rewrite keeps, after the summary.
_KEEP = re.compile(r"<!-- qrnn-bench:keep -->.*?<!-- qrnn-bench:end-keep -->", re.S)

# Titles of each area's plot (what the brief of each benchmark promises to show).
PLOT_TITLES = {
    "forget-mult": "ForgetMult: speed-ups, and achieved bandwidth against a copy of the same bytes (roofline)",
    "linear-scan": "linear_scan: bandwidth against a copy (and ForgetMult's), associative_scan, bfloat16",
    "layer": "QRNN layer: speed against nn.LSTM / nn.GRU and against its own GEMMs",
    "checkpoint": "Checkpoints: blocking and total time against torch.save and torch.distributed.checkpoint",
    "train": "Training step time per precision",
}

# The headline figures (area, the figure's name up to where it varies): BENCHMARKS.md opens
# with them, read from the areas' own rows, so each figure is written once; the README's
# table is checked against it (tests/packaging/test_site.py).
HEADLINE = [
    ("forget-mult", "fwd+bwd vs per-timestep loop"),
    ("layer", "speed-up over nn.LSTM"),
    ("layer", "speed-up over nn.GRU"),
    ("layer", "bf16 autocast vs float32 layer"),
    ("layer", "fused gates vs unfused PyTorch path, fwd+bwd float32"),
    ("linear-scan", "linear_scan fwd+bwd vs torch.compile(associative_scan)"),
    ("checkpoint", "save() blocking, overlap mode"),
    ("train", "checkpoint stall per epoch, cpu fp32"),
    ("awd", "PTB preset training step, qrnn-train fp32"),
    ("scale", "adaptive softmax's share"),
]
# Plots shown under the headline table.
HEADLINE_PLOTS = ["forget-mult", "layer", "checkpoint"]

HEADER = """# Benchmarks

Measured by `python -m qrnn.bench --write BENCHMARKS.md --plots docs/benchmarks` (one area:
`python -m qrnn.bench <area> --write BENCHMARKS.md --plots docs/benchmarks`). Every target is a
ratio against a baseline measured in the same run, so figures from a noisy or different machine
still compare like with like; absolute times are in the notes for context only. Each area's
section says where and when it was measured; re-running an area rewrites only its section.
"""


def machine_line(info: dict, quick: bool) -> str:
    gpu = info.get("gpu", "none")
    line = (f"Measured {info.get('date')} on {info.get('cpu')} ({info.get('cores')} cores, "
            f"{info.get('torch threads')} torch threads), GPU: {gpu}. Python {info.get('python')}, "
            f"torch {info.get('torch')}, torch-qrnn {info.get('qrnn')} ({info.get('compiler')}, "
            f"CPU kernels {info.get('simd')}, CUDA kernels {info.get('cuda kernels')}).")
    if quick:
        line += " **Quick run (`--quick`): small shapes, a smoke test, not representative.**"
    return line


def _section(area: str, results: list, info: dict, quick: bool, plot: Optional[str]) -> str:
    targets = [r for r in results if r.met is not None]
    meta = {"met": sum(bool(r.met) for r in targets), "targets": len(targets), "date": info.get("date"),
            "machine": info.get("cpu"), "gpu": info.get("gpu"), "quick": quick}
    lines = [f"<!-- qrnn-bench:begin {area} {json.dumps(meta)} -->", f"## {area}", "", machine_line(info, quick), "",
             markdown_table(results)]
    if plot:
        lines += ["", f"![{area}]({plot})"]
    lines.append(_END.format(area=area))
    return "\n".join(lines)


def _read_sections(text: str) -> dict:
    """area -> (section text, metadata) of an existing BENCHMARKS.md."""
    sections = {}
    for match in _BEGIN.finditer(text):
        area = match.group("area")
        end = text.find(_END.format(area=area), match.end())
        if end < 0:
            continue
        body = text[match.start():end + len(_END.format(area=area))]
        try:
            meta = json.loads(match.group("meta"))
        except ValueError:
            meta = {}
        sections[area] = (body, meta)
    return sections


def _summary(sections: dict, order: list) -> str:
    lines = ["## Summary", "", "| area | targets met | measured on |", "|---|---|---|"]
    for area in order:
        if area not in sections:
            continue
        meta = sections[area][1]
        where = f"{meta.get('date', '?')}, {meta.get('machine', '?')}"
        if meta.get("gpu") not in (None, "none"):
            where += f", {meta['gpu']}"
        if meta.get("quick"):
            where += " (quick)"
        lines.append(f"| [{area}](#{area}) | {meta.get('met', '?')} / {meta.get('targets', '?')} | {where} |")
    return "\n".join(lines)


def _rows(section: str) -> list:
    """The (figure, value, target, status, note) rows of a section's table."""
    rows = []
    for line in section.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if line.startswith("| ") and len(cells) == 5 and cells[0] != "figure":
            rows.append(cells)
    return rows


def headline(sections: dict) -> str:
    """The headline table: each HEADLINE figure as its area's section states it, with the
    machine and date of that section; then the headline plots."""
    lines = ["## Headline figures", "", "| figure | ratio | target | met | machine, date |", "|---|---|---|---|---|"]
    for area, prefix in HEADLINE:
        if area not in sections:
            continue
        body, meta = sections[area]
        for figure, value, target, status, _note in _rows(body):
            if figure.startswith(prefix):
                met = {"met": "yes", "NOT met": "**no**"}.get(status, status or "-")
                lines.append(f"| {figure} | {value} | {target} | {met} | {meta.get('machine', '?')}, "
                             f"{meta.get('date', '?')} |")
                break
    plots = []
    for area in HEADLINE_PLOTS:
        match = re.search(r"!\[[^\]]*\]\(([^)]+)\)", sections.get(area, ("", {}))[0])
        if match:
            plots.append(f"![{area}]({match.group(1)})")
    return "\n".join(lines + ([""] + plots if plots else []))


def write_markdown(path: str, results_by_area: dict, info: dict, quick: bool, plots: Optional[dict] = None,
                   area_order: Optional[list] = None) -> None:
    """(Re)write BENCHMARKS.md: sections of the areas in `results_by_area` replaced, the
    others and the hand-written keep block kept, a summary of all on top."""
    try:
        with open(path, encoding="utf-8") as fh:
            existing = fh.read()
    except FileNotFoundError:
        existing = ""
    sections = _read_sections(existing)
    kept = _KEEP.search(existing)
    folder = os.path.dirname(os.path.abspath(path))
    for area, results in results_by_area.items():
        plot = (plots or {}).get(area)
        rel = os.path.relpath(plot, folder).replace(os.sep, "/") if plot else None
        text = _section(area, results, info, quick, rel)
        sections[area] = (text, _read_sections(text)[area][1])
    order = list(area_order or [])
    order += sorted(a for a in sections if a not in order)
    body = [HEADER, headline(sections), _summary(sections, order)] + ([kept.group(0)] if kept else [])
    body += [sections[a][0] for a in order if a in sections]
    tmp = path + ".tmp"
    with open(tmp, "w", encoding="utf-8") as fh:
        fh.write("\n\n".join(body) + "\n")
    os.replace(tmp, path)


# ---- plots -------------------------------------------------------------------------------

_TARGET = re.compile(r"([<>]=?)\s*\+?(-?[\d.]+)")
_UNIT = re.compile(r"\(([^()]+)\)\s*$")


def target_value(target: Optional[str]) -> Optional[float]:
    """The number in a target such as '>= 20x', '<= 5%' or '<= +1%'."""
    match = _TARGET.search(target or "")
    return float(match.group(2)) if match else None


def _wrap(label: str, width: int = 58) -> str:
    return "\n".join(textwrap.wrap(label, width)) or label


def plot_area(area: str, results: list, path: str) -> Optional[str]:
    """One PNG for an area: a panel of its figures per unit (bars, the target marked, green
    met / red not met / grey no target) and, when results carry `series`, a panel of those
    numbers as grouped bars (e.g. achieved GB/s of the kernel next to a copy of the same
    bytes). Returns the path, or None when there is nothing to draw."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    by_unit: dict = {}
    for r in results:
        by_unit.setdefault(r.unit, []).append(r)
    with_series = [r for r in results if r.series]
    panels = list(by_unit.items()) + ([("series", with_series)] if with_series else [])
    if not panels:
        return None
    heights = [max(1.6, 0.55 * (len(rs) if unit != "series" else sum(len(r.series) for r in rs)) + 0.9)
               for unit, rs in panels]
    fig, axes = plt.subplots(len(panels), 1, figsize=(11, sum(heights)), squeeze=False,
                             gridspec_kw={"height_ratios": heights})
    for ax, (unit, rs) in zip(axes[:, 0], panels):
        if unit == "series":
            _series_panel(ax, rs)
        else:
            _figures_panel(ax, unit, rs)
    fig.suptitle(PLOT_TITLES.get(area, area), fontsize=11)
    fig.tight_layout(rect=(0, 0, 1, 0.97))
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def _figures_panel(ax, unit: str, results: list) -> None:
    ys = list(range(len(results)))[::-1]
    colors = ["#999999" if r.met is None else ("#2e8b57" if r.met else "#c0392b") for r in results]
    ax.barh(ys, [r.value for r in results], color=colors, height=0.6)
    for y, r in zip(ys, results):
        if math.isfinite(r.value):
            ax.text(r.value, y, f" {format_number(r.value)}{r.unit}", va="center", fontsize=8)
        else:  # not measured here (e.g. needs a GPU)
            ax.text(0, y, f" n/a: {r.note or 'not measured'}", va="center", fontsize=7, color="#555555")
        goal = target_value(r.target)
        if goal is not None:
            ax.plot([goal, goal], [y - 0.4, y + 0.4], color="black", linewidth=2)
    ax.set_yticks(ys)
    ax.set_yticklabels([_wrap(r.name) for r in results], fontsize=7)
    reference = 100.0 if unit == "%" else (1.0 if unit == "x" else None)
    if reference is not None:
        ax.axvline(reference, color="#555555", linestyle=":", linewidth=1)
    label = {"x": "ratio (x); black tick: target; dotted: parity",
             "%": "percent of the baseline; black tick: target"}.get(unit, unit)
    ax.set_xlabel(label, fontsize=8)
    ax.margins(x=0.15)


def _series_panel(ax, results: list) -> None:
    keys = []
    for r in results:
        keys += [k for k in r.series if k not in keys]
    units = {m.group(1) for k in keys if (m := _UNIT.search(k))}
    width = 0.8 / len(keys)
    ys = list(range(len(results)))[::-1]
    for i, key in enumerate(keys):
        values = [r.series.get(key, 0.0) for r in results]
        bars = ax.barh([y + (len(keys) / 2 - i - 0.5) * width for y in ys], values, height=width, label=key)
        for bar, v in zip(bars, values):
            ax.text(bar.get_width(), bar.get_y() + bar.get_height() / 2, f" {v:.3g}", va="center", fontsize=7)
    ax.set_yticks(ys)
    ax.set_yticklabels([_wrap(r.name) for r in results], fontsize=7)
    ax.set_xlabel(", ".join(sorted(units)) or "value", fontsize=8)
    ax.legend(fontsize=7, loc="best", framealpha=0.8)
    ax.margins(x=0.12)


def write_plots(folder: str, results_by_area: dict) -> dict:
    """area -> PNG path for every area that has something to draw."""
    written = {}
    for area, results in results_by_area.items():
        path = plot_area(area, results, os.path.join(folder, f"{area}.png"))
        if path:
            written[area] = path
    return written


__all__ = ["write_markdown", "write_plots", "plot_area", "machine_line", "target_value", "Result"]
