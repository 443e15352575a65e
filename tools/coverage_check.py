"""Fails unless the test run's line coverage of the qrnn package meets its floors.

Run after ``python -m pytest --cov=qrnn`` (which writes ``.coverage``):
``python tools/coverage_check.py``. The floors: the CUDA backend (ops/core/cuda.py and each
op family's ops/<family>/kernels.py, which only a GPU runs for real and CI runs through the
emulated kernels) and the package as a whole.
"""

import sys

import coverage

FLOORS = {"ops/core/cuda.py": 95.0, "ops/forget_mult/kernels.py": 95.0, "ops/qrnn_gates/kernels.py": 95.0,
          "ops/linear_scan/kernels.py": 95.0}
TOTAL_FLOOR = 90.0


def main() -> int:
    cov = coverage.Coverage()
    cov.load()
    data = cov.get_data()
    statements = missing = 0
    per_file = {}
    for path in sorted(data.measured_files()):
        _, stmts, _, miss, _ = cov.analysis2(path)
        statements += len(stmts)
        missing += len(miss)
        per_file[path] = 100.0 * (len(stmts) - len(miss)) / max(len(stmts), 1)
    total = 100.0 * (statements - missing) / max(statements, 1)
    failures = []
    for name, floor in FLOORS.items():
        found = [pct for path, pct in per_file.items() if path.endswith("/qrnn/" + name)]
        if not found:
            failures.append(f"{name}: not measured")
        elif found[0] < floor:
            failures.append(f"{name}: {found[0]:.1f}% of lines < {floor}%")
        else:
            print(f"coverage {name}: {found[0]:.1f}% (floor {floor}%)")
    print(f"coverage qrnn package: {total:.1f}% of {statements} lines (floor {TOTAL_FLOOR}%)")
    if total < TOTAL_FLOOR:
        failures.append(f"package: {total:.1f}% < {TOTAL_FLOOR}%")
    for failure in failures:
        print("coverage below its floor:", failure, file=sys.stderr)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
