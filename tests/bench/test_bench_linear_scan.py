"""The linear-scan benchmark area without its compile: the combine that torch's
associative_scan is given is the recurrence's, the area is listed, and its bandwidth figures
run (tiny shape, one round; what they measure is the benchmark's business)."""

import math

import torch

import qrnn
from qrnn.bench import AREAS, report
from qrnn.bench import linear_scan as bench_linear_scan
from qrnn.bench.common import QUICK_COPY_NOTE


def test_area_is_listed_with_a_plot_title():
    assert AREAS["linear-scan"] == "linear_scan"
    assert "linear-scan" in report.PLOT_TITLES


def test_combine_is_the_recurrence_and_associative():
    a = torch.rand(7, 2, 5, dtype=torch.float64)
    b = torch.randn(7, 2, 5, dtype=torch.float64)
    combine = bench_linear_scan.combine
    acc, hs = (a[0], b[0]), [b[0]]
    for t in range(1, 7):
        acc = combine(acc, (a[t], b[t]))
        hs.append(acc[1])
    torch.testing.assert_close(torch.stack(hs), qrnn.linear_scan(a, b))
    x, y, z = ((a[i], b[i]) for i in range(3))
    for left, right in zip(combine(combine(x, y), z), combine(x, combine(y, z))):
        torch.testing.assert_close(left, right)
    # torch's associative_scan runs eagerly too (the benchmark times it under torch.compile).
    if bench_linear_scan.has_generic_associative_scan():  # not torch 2.4's
        torch.testing.assert_close(bench_linear_scan.associative_scan_h(a, b), qrnn.linear_scan(a, b))


def test_bandwidth_figures_run_without_targets_when_quick():
    results = bench_linear_scan.bandwidth_and_bf16(4, 2, 16, rounds=1, quick=True)
    assert len(results) == 4 and all(r.area == "linear-scan" and r.met is None for r in results)
    # A copy of a quick shape times per-call overhead, not bandwidth: the three shares of a
    # copy's bandwidth are n/a with that reason (once printed as 897% or 2.89e+04%).
    for r in results[:3]:
        assert math.isnan(r.value) and QUICK_COPY_NOTE in r.note and r.row()[2] == "n/a", r.row()
        assert all(v > 0 for v in r.series.values())  # the GB/s behind it are still drawn
    assert results[3].value > 0
    assert not any("nan" in cell or "e+" in cell for r in results for cell in r.row())
    assert "forget_mult" in results[1].name and "bfloat16 vs float32" in results[3].name
