"""``python -m qrnn.bench [area ...] [--quick]``: run the benchmarks, print one table of
each figure against its target."""

import argparse
import importlib
import sys

from . import AREAS
from .common import format_table, machine_info
from .report import plot_area, write_report


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m qrnn.bench", description=__doc__)
    parser.add_argument("areas", nargs="*", choices=[[]] + list(AREAS), metavar="area",
                        help=f"areas to run (default: all): {', '.join(AREAS)}")
    parser.add_argument("--quick", action="store_true", help="small and short: a smoke test for CI")
    parser.add_argument("--write", metavar="PATH", help="rewrite these areas' sections of a report, e.g. BENCHMARKS.md")
    parser.add_argument("--plots", metavar="DIR", help="save one PNG per area of its figures against their targets")
    args = parser.parse_args(argv)
    areas = args.areas or list(AREAS)
    info = machine_info()
    print("machine: " + ", ".join(f"{k} {v}" for k, v in info.items()), flush=True)
    by_area = {}
    for area in areas:
        module = importlib.import_module(f".{AREAS[area]}", __package__)
        print(f"running {area} ...", flush=True)
        by_area[area] = module.run(quick=args.quick)
    results = [r for area_results in by_area.values() for r in area_results]
    print()
    print(format_table(results))
    by_area = {area: r for area, r in by_area.items() if r}  # an area with nothing to say (no GPU) keeps its section
    plots = {area: plot_area(area, r, args.plots) for area, r in by_area.items()} if args.plots else {}
    if args.write:
        write_report(args.write, by_area, info, list(AREAS), {a: p for a, p in plots.items() if p})
        print(f"wrote {args.write}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
