"""The benchmark report machinery (no timing here): Result stays backward compatible,
BENCHMARKS.md sections are replaced per area and the others kept, plots are written."""

import sys
import types

import pytest

from qrnn.bench import AREAS, report
from qrnn.bench import __main__ as bench_main
from qrnn.bench.common import Result, format_table, machine_info, markdown_table


def fake_results(area, scale=1.0):
    return [
        Result(area, "speed-up over the baseline, T=7", 3.0 * scale, "x", ">= 2x", 3.0 * scale >= 2, "a 1 ms, b 3 ms"),
        Result(area, "blocking vs torch.save", 4.0, "%", "<= 5%", True),
        Result(area, "bandwidth vs copy", 65.0, "%", ">= 70%", False, "",
               series={"qrnn (GB/s)": 13.0, "copy (GB/s)": 20.0}),
        Result(area, "context figure", 1.5),
    ]


def test_result_positional_constructor_unchanged_and_series_optional():
    r = Result("a", "b", 1.0, "x", ">= 1x", True, "note")
    assert r.series == {} and Result("a", "b", 2.0).series is not r.series  # a fresh dict each
    assert r.row() == ["a", "b", "1x", ">= 1x", "met", "note"]
    assert "NOT met" in format_table([Result("a", "b", 0.5, "x", ">= 1x", False)])


def test_machine_info_records_machine_and_versions():
    info = machine_info()
    for key in ("date", "cpu", "cores", "torch threads", "gpu", "python", "torch", "qrnn", "compiler", "simd"):
        assert info.get(key) not in (None, ""), key


@pytest.mark.parametrize("target, value", [(">= 20x", 20.0), ("<= 1.05x", 1.05), ("<= +1%", 1.0), (">= 70%", 70.0),
                                           (None, None), ("", None)])
def test_target_value(target, value):
    assert report.target_value(target) == value


def test_plots_are_pngs(tmp_path):
    written = report.write_plots(str(tmp_path), {"alpha": fake_results("alpha"), "empty": []})
    assert set(written) == {"alpha"}
    assert open(written["alpha"], "rb").read(8) == b"\x89PNG\r\n\x1a\n"


def test_markdown_sections_replaced_per_area_and_others_kept(tmp_path):
    md = tmp_path / "BENCHMARKS.md"
    info = machine_info()
    plots = report.write_plots(str(tmp_path / "plots"), {"alpha": fake_results("alpha")})
    report.write_markdown(str(md), {"alpha": fake_results("alpha"), "beta": fake_results("beta")}, info, False,
                          plots, area_order=["alpha", "beta"])
    text = md.read_text()
    assert "## alpha" in text and "## beta" in text and "(plots/alpha.png)" in text
    assert "| [alpha](#alpha) | 2 / 3 |" in text
    assert info["cpu"] in text and info["torch"] in text and info["compiler"] in text

    # Only beta runs again, now failing its first target: alpha's section stays as it was.
    alpha_before = text[text.index("<!-- qrnn-bench:begin alpha"):text.index("<!-- qrnn-bench:end alpha -->")]
    report.write_markdown(str(md), {"beta": fake_results("beta", scale=0.1)}, info, True, {},
                          area_order=["alpha", "beta"])
    text = md.read_text()
    assert alpha_before in text
    assert text.count("## alpha") == 1 and text.count("## beta") == 1
    assert "| [beta](#beta) | 1 / 3 |" in text and "(quick)" in text
    assert text.index("## alpha") < text.index("## beta")
    assert markdown_table(fake_results("beta", 0.1)) in text


def test_cli_runs_areas_and_writes_report(tmp_path, monkeypatch, capsys):
    """The whole command on a fake area: table, targets line, markdown and plot."""
    module = types.ModuleType("qrnn.bench._fake_area")
    calls = []
    module.run = lambda quick=False: calls.append(quick) or fake_results("fake")
    monkeypatch.setitem(sys.modules, "qrnn.bench._fake_area", module)
    monkeypatch.setitem(AREAS, "fake", "_fake_area")
    md, plots = tmp_path / "B.md", tmp_path / "plots"
    assert bench_main.main(["fake", "--quick", "--write", str(md), "--plots", str(plots)]) == 0
    out = capsys.readouterr().out
    assert calls == [True]
    assert "speed-up over the baseline" in out and "targets met: 2 of 3" in out
    assert (plots / "fake.png").is_file() and "## fake" in md.read_text()


def test_hand_written_block_survives_rewrites(tmp_path):
    path = tmp_path / "BENCHMARKS.md"
    info = machine_info()
    report.write_markdown(str(path), {"layer": fake_results("layer")}, info, False)
    note = "<!-- qrnn-bench:keep -->\n## Conditions\n\nA quiet machine.\n<!-- qrnn-bench:end-keep -->"
    marker = "<!-- qrnn-bench:begin layer"
    path.write_text(path.read_text().replace(marker, note + "\n\n" + marker, 1))
    report.write_markdown(str(path), {"layer": fake_results("layer", 2.0)}, info, False)
    text = path.read_text()
    assert text.count("A quiet machine.") == 1
    assert text.index("## Summary") < text.index("## Conditions") < text.index("## layer")


def test_figures_print_without_nan_or_scientific_notation():
    """A figure not measured prints n/a (its note says why); a large or tiny one is written
    out, never as 2.89e+04% or 4.32e-05%."""
    assert Result("a", "b", float("nan"), "x", "<= 0.65x", None, "skipped: no CUDA device").row()[2] == "n/a"
    assert Result("a", "b", 28_912.3, "%").row()[2] == "28,912%"
    assert Result("a", "b", 4.32e-05, "%").row()[2] == "0.0000432%"
    assert [Result("a", "b", v).row()[2] for v in (0.039, 0.918, 13.5, 137.4, 1.0)] == [
        "0.039x", "0.918x", "13.5x", "137x", "1x"]


def test_quick_report_has_no_nan_and_no_scientific_notation(tmp_path, monkeypatch, capsys):
    """The quick run's table and markdown, with figures not measured (no GPU, a copy too
    small to time) and an extreme percentage."""
    module = types.ModuleType("qrnn.bench._fake_area")
    module.run = lambda quick=False: fake_results("fake") + [
        Result("fake", "fp16 / fp32 epoch time, cuda", float("nan"), "x", "<= 0.65x", None, "skipped: no CUDA device"),
        Result("fake", "loss sequence vs a reference", float("nan"), "", "<= 1e-4 relative", None, "skipped"),
        Result("fake", "an extreme share", 28_900.0, "%", note="rounds 4.32% to 1151%"),
        Result("fake", "a tiny stall", 0.0000432, "%", "<= 1%", True)]
    monkeypatch.setitem(sys.modules, "qrnn.bench._fake_area", module)
    monkeypatch.setitem(AREAS, "fake", "_fake_area")
    md = tmp_path / "B.md"
    assert bench_main.main(["fake", "--quick", "--write", str(md), "--plots", str(tmp_path / "plots")]) == 0
    out = capsys.readouterr().out
    table = out[out.index("area "):out.index("wrote ")]  # not the paths written (the test's name has "nan")
    for text in (table, md.read_text()):
        assert "nan" not in text.lower().replace("n/a", "") and "e+" not in text and "e-0" not in text, text
        assert "n/a" in text and "28,900%" in text and "0.0000432%" in text
