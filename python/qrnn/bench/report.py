"""The benchmark report: BENCHMARKS.md sections per area and PNG plots of the figures.

A run rewrites the sections of the areas it ran and keeps the others, so areas measured
on different machines (the CUDA figures need a GPU) live side by side, each with its
machine, date and versions.
"""

from __future__ import annotations

import re
from pathlib import Path

from .common import markdown_table

HEADER = """# Benchmarks

Every figure is a ratio against a baseline measured in the same run (the machines are
shared and noisy, so absolute times are context only). Reproduce with
`python -m qrnn.bench [area ...] --write BENCHMARKS.md --plots bench-plots`; each section
says on which machine, when and with which versions it was measured.
"""

_SECTION = re.compile(r"<!-- area:(?P<area>[\w-]+) -->\n(?P<body>.*?)<!-- end:(?P=area) -->\n", re.S)


def _section(area: str, results: list, info: dict, plot: str | None) -> str:
    met = [r for r in results if r.met is not None]
    summary = f"{sum(r.met for r in met)} of {len(met)} targets met" if met else "no targets checked"
    machine = (f"{info['cpu']}, {info['cores']} threads, GPU: {info['gpu']}; {info['date']}; "
               f"Python {info['python']}, torch {info['torch']}, qrnn {info['qrnn']}, "
               f"{info['compiler']}, CPU kernels {info['simd']}")
    lines = [f"## {area}", "", f"Machine: {machine}.", "", f"**{summary}.**", "", markdown_table(results), ""]
    if plot:
        lines += [f"![{area}]({plot})", ""]
    return "\n".join(lines)


def write_report(path: str, by_area: dict, info: dict, order: list, plots: dict) -> None:
    """Rewrite the sections of the areas in `by_area` in `path`, keeping the others."""
    file = Path(path)
    sections = {}
    if file.exists():
        sections = {m["area"]: m["body"] for m in _SECTION.finditer(file.read_text())}
    for area, results in by_area.items():
        sections[area] = _section(area, results, info, plots.get(area))
    ordered = [a for a in order if a in sections] + sorted(a for a in sections if a not in order)
    body = "".join(f"<!-- area:{a} -->\n{sections[a]}<!-- end:{a} -->\n" for a in ordered)
    file.write_text(HEADER + "\n" + body)


def plot_area(area: str, results: list, folder: str) -> str | None:
    """A horizontal bar per ratio figure, green when its target is met, red when not;
    returns the PNG's path, or None when the area has nothing to plot."""
    rows = [r for r in results if r.unit in ("x", "%")]
    if not rows:
        return None
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out = Path(folder)
    out.mkdir(parents=True, exist_ok=True)
    fig, ax = plt.subplots(figsize=(9, 0.45 * len(rows) + 1.2))
    colors = ["tab:gray" if r.met is None else ("tab:green" if r.met else "tab:red") for r in rows]
    ax.barh(range(len(rows)), [r.value for r in rows], color=colors)
    ax.set_yticks(range(len(rows)), [f"{r.name} ({r.unit})" + (f"  [{r.target}]" if r.target else "")
                                     for r in rows], fontsize=7)
    ax.invert_yaxis()
    ax.set_xscale("log")
    ax.set_title(f"qrnn.bench {area}: green = target met, red = not met, gray = no target", fontsize=9)
    fig.tight_layout()
    png = out / f"{area}.png"
    fig.savefig(png, dpi=110)
    plt.close(fig)
    return str(png)
