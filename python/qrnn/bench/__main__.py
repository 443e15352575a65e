"""``python -m qrnn.bench [area ...] [--quick] [--write BENCHMARKS.md] [--plots DIR]``: run the
benchmarks of every area (or the ones named) in one process, print one table of each figure
against its target, and optionally (re)write BENCHMARKS.md sections and PNG plots.

``--quick`` runs small shapes and few repeats: a smoke test for CI (it checks that every
benchmark runs, not that targets are met). On a machine with a GPU the areas add their CUDA
figures."""

import argparse
import importlib
import sys
import time

from . import AREAS
from .common import format_table, machine_info


def main(argv=None) -> int:
    # The docstring's reStructuredText literals (``...``) read as plain text in a terminal.
    parser = argparse.ArgumentParser(prog="python -m qrnn.bench", description=(__doc__ or "").replace("``", ""),
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("areas", nargs="*", choices=[[]] + list(AREAS), metavar="area",
                        help=f"areas to run (default: all): {', '.join(AREAS)}")
    parser.add_argument("--quick", action="store_true", help="small and short: a smoke test for CI")
    parser.add_argument("--write", metavar="MARKDOWN",
                        help="(re)write this file's sections of the areas that ran, e.g. BENCHMARKS.md")
    parser.add_argument("--plots", metavar="DIR", help="write one PNG per area into DIR (matplotlib)")
    parser.add_argument("--checkpoint-sizes", metavar="GIB[,GIB...]", default="",
                        help="checkpoint area: also time the first save() of states this large (GiB), e.g. 2,5")
    args = parser.parse_args(argv)
    try:
        sizes = [float(v) for v in args.checkpoint_sizes.split(",") if v.strip()]
    except ValueError:
        parser.error(f"--checkpoint-sizes takes GiB numbers separated by commas, got {args.checkpoint_sizes!r}")
    if any(not 0 < v <= 1024 for v in sizes):
        parser.error(f"--checkpoint-sizes: each size must be in (0, 1024] GiB, got {args.checkpoint_sizes!r}")
    areas = list(dict.fromkeys(args.areas)) or list(AREAS)
    info = machine_info()
    print("machine: " + ", ".join(f"{k} {v}" for k, v in info.items()), flush=True)

    results_by_area = {}
    for area in areas:
        module = importlib.import_module(f".{AREAS[area]}", __package__)
        print(f"running {area}{' (quick)' if args.quick else ''} ...", flush=True)
        start = time.perf_counter()
        extra = {"first_save_gib": sizes} if area == "checkpoint" and sizes else {}
        results_by_area[area] = module.run(quick=args.quick, **extra)
        count = len(results_by_area[area])
        print(f"  {area}: {count} figure{'' if count == 1 else 's'} in {time.perf_counter() - start:.1f} s",
              flush=True)

    results = [r for rs in results_by_area.values() for r in rs]
    print()
    print(format_table(results))
    targets = [r for r in results if r.met is not None]
    print(f"\ntargets met: {sum(bool(r.met) for r in targets)} of {len(targets)}")

    # An area with nothing to report here (e.g. GPU-only figures on a CPU machine) keeps
    # whatever section and plot it already has.
    results_by_area = {area: rs for area, rs in results_by_area.items() if rs}
    plots = {}
    if args.plots or args.write:
        from . import report  # matplotlib only when a report is asked for

        if args.plots:
            plots = report.write_plots(args.plots, results_by_area)
            for path in plots.values():
                print(f"wrote {path}")
        if args.write:
            report.write_markdown(args.write, results_by_area, info, args.quick, plots, area_order=list(AREAS))
            print(f"wrote {args.write} ({', '.join(results_by_area)})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
