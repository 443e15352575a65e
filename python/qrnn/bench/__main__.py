"""``python -m qrnn.bench [area ...] [--quick]``: run the benchmarks, print one table of
each figure against its target."""

import argparse
import importlib
import sys

from . import AREAS
from .common import format_table, machine_info


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m qrnn.bench", description=__doc__)
    parser.add_argument("areas", nargs="*", choices=[[]] + list(AREAS), metavar="area",
                        help=f"areas to run (default: all): {', '.join(AREAS)}")
    parser.add_argument("--quick", action="store_true", help="small and short: a smoke test for CI")
    args = parser.parse_args(argv)
    areas = args.areas or list(AREAS)
    info = machine_info()
    print("machine: " + ", ".join(f"{k} {v}" for k, v in info.items()), flush=True)
    results = []
    for area in areas:
        module = importlib.import_module(f".{AREAS[area]}", __package__)
        print(f"running {area} ...", flush=True)
        results += module.run(quick=args.quick)
    print()
    print(format_table(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
