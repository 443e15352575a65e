"""The documentation states each fact once, and the facts that live in code agree with it:
the CUDA architectures, toolkits and drivers, the Python/torch support matrix, qrnn-train's
flags (generated from Settings), the headline benchmark figures; the README stays a landing
page. (The site's strict build runs in CI: `mkdocs build --strict`; every page's Python
blocks run in test_docs_run.py; the ops' schemas in tests/torch_library/test_schemas.py.)"""

import dataclasses
import re
from pathlib import Path

import pytest

from conftest import docs_hooks, site_page

REPO = Path(__file__).resolve().parents[2]
INSTALL = (REPO / "docs" / "install.md").read_text()
PYPROJECT = (REPO / "pyproject.toml").read_text()
# Every Markdown page of the repository a reader may open, and the code comments of the build.
PAGES = [REPO / "README.md", REPO / "CHANGELOG.md", REPO / "BENCHMARKS.md",
         *sorted(p for p in (REPO / "docs").rglob("*.md"))]


def _pages_stating(pattern: str) -> list:
    return sorted(str(p.relative_to(REPO)) for p in PAGES + [REPO / "pyproject.toml", REPO / "CMakeLists.txt"]
                  if re.search(pattern, p.read_text()))


def test_readme_is_a_landing_page():
    lines = (REPO / "README.md").read_text().splitlines()
    assert len(lines) <= 150, f"README.md has {len(lines)} lines; the guides belong on the site (docs/)"


def test_cuda_architectures_are_cmakes():
    """The install page names exactly the architectures CMake compiles by default."""
    cmake = (REPO / "CMakeLists.txt").read_text()
    default = re.search(r"set\(CMAKE_CUDA_ARCHITECTURES ([^)]+)\)", cmake).group(1).split()
    capabilities = [f"{int(a.split('-')[0]) // 10}.{int(a.split('-')[0]) % 10}" for a in default]
    ptx = [c for a, c in zip(default, capabilities) if not a.endswith("-real")]
    stated = re.search(r"compute capability \*\*([^*]+)\*\*", INSTALL).group(1)
    assert re.findall(r"\d+\.\d+", stated.split("plus")[0]) == capabilities
    assert re.findall(r"PTX of (\d+\.\d+)", stated) == ptx


def test_cuda_toolkits_and_drivers():
    """The release wheels' toolkit (pyproject's build image) and the driver each CUDA major
    needs (cuda/common/runtime_checks.hpp, what the first launch checks) are the install
    page's, and no other page or build file states a driver version."""
    image = re.search(r'manylinux-x86_64-image = "[^"]*:cuda(\d+)\.(\d+)"', PYPROJECT)
    cudacxx = re.search(r'CUDACXX = "[^"]*cuda-(\d+\.\d+)/', PYPROJECT).group(1)
    assert cudacxx == f"{image.group(1)}.{image.group(2)}"
    assert f"release wheels: **CUDA {cudacxx}**" in INSTALL
    checks = (REPO / "cuda" / "common" / "runtime_checks.hpp").read_text()
    drivers = dict(re.findall(r"case (\d+): return \"([\d.]+)\"", checks))
    for major in ("12", "13"):  # the release wheels' and CI's toolkits
        driver = drivers[major]
        row = re.search(rf"^\| CUDA {major}\.x[^\n]*\| >= \*\*([\d.]+)\*\* \|", INSTALL, flags=re.M)
        assert row and row.group(1) == driver, f"install page: CUDA {major} needs driver {driver}"
        assert _pages_stating(re.escape(driver)) == ["docs/install.md"]


def test_support_matrix():
    """Python and torch bounds (pyproject), the wheels' Pythons (cibuildwheel) and CI's legs
    (.ci/run) are the install page's."""
    python_min = re.search(r'requires-python = ">=(\d+\.\d+)"', PYPROJECT).group(1)
    torch_min = re.search(r'"torch>=(\d+\.\d+)"', PYPROJECT).group(1)
    assert f"| Python | >= {python_min} |" in INSTALL
    assert f"| torch | >= {torch_min} |" in INSTALL
    builds = re.findall(r"cp3(\d+)-\*", re.search(r"^build = \"([^\"]+)\"", PYPROJECT, flags=re.M).group(1))
    assert f"CPython 3.{min(map(int, builds))} to 3.{max(map(int, builds))}" in INSTALL
    ci = (REPO / ".ci" / "run").read_text()
    for leg in re.findall(r'tools/ci_matrix\.sh ([\d.]+ (?:"[^"]+"|\w+))', ci):
        assert f"`tools/ci_matrix.sh {leg}`" in INSTALL, leg
    main_torch = re.search(r"pip install --quiet torch==([\d.]+)", ci).group(1)
    assert f"| {main_torch} | CPU and CUDA kernels" in INSTALL
    assert _pages_stating(r"Python >= 3\.\d+, torch >= ") in ([], ["docs/install.md"])


def test_train_flags_are_generated_from_settings():
    """Every Settings field is a flag on the command-line page, with its help text."""
    from qrnn.train.settings import Settings

    page = site_page("reference/cli.md")
    for f in dataclasses.fields(Settings):
        flag = "--" + f.name.replace("_", "-")
        assert re.search(rf"^\| `{re.escape(flag)}[ `]", page, flags=re.M), f"{flag} is missing from the flags page"
        assert f.metadata["help"].split("(")[0][:40].replace("|", "\\|").replace("*", "\\*") in page, flag
    assert "<!--" not in page, "a marker was left unrendered"


def test_no_page_lists_flags_by_hand():
    """The flags are listed once, generated: no page spells a long run of qrnn-train flags."""
    for page in PAGES:
        runs = re.findall(r"(?:`--[a-z-]+[^`]*`,? ){12,}", page.read_text())
        assert runs == [], f"{page.relative_to(REPO)} lists qrnn-train flags by hand"


def _headline_rows(text: str) -> list:
    section = text.split("## Headline figures", 1)[1].split("\n## ", 1)[0]
    return [line for line in section.splitlines() if line.startswith("| ") and not line.startswith("| figure")]


def test_readme_headline_figures_are_benchmarks_md():
    """README's table is BENCHMARKS.md's headline table, row for row; that one is generated
    from the areas' own rows (qrnn.bench.report.HEADLINE)."""
    from qrnn.bench import report

    benchmarks = (REPO / "BENCHMARKS.md").read_text()
    rows = _headline_rows(benchmarks)
    assert rows and rows == _headline_rows((REPO / "README.md").read_text())
    regenerated = report.headline(report._read_sections(benchmarks))
    assert _headline_rows(regenerated) == rows


@pytest.mark.parametrize("target, page_dir, expected", [
    ("docs/install.md#x", "", "install.md#x"),
    ("BENCHMARKS.md", "", "benchmarks.md"),
    ("../../BENCHMARKS.md", "guide", "../benchmarks.md"),
    ("https://example.org/a.md", "", "https://example.org/a.md"),
])
def test_links_are_rewritten_for_the_site(target, page_dir, expected):
    hooks = docs_hooks()
    source = "docs/" + page_dir if target.startswith("..") else ""
    assert hooks.site_link(target, source.rstrip("/"), page_dir) == expected


def test_every_page_is_in_the_site():
    nav = (REPO / "mkdocs.yml").read_text()
    missing = [str(p.relative_to(REPO / "docs")) for p in (REPO / "docs").rglob("*.md")
               if str(p.relative_to(REPO / "docs")) not in nav]
    assert missing == []


def test_flags_page_shows_choices_without_backslashes():
    """A choice list sits in a code span, where a table splits no cell at a bar and an
    escaping backslash would show as written (`auto\\|fp32`)."""
    page = site_page("reference/cli.md")
    assert "| `--precision auto|fp32|fp16|bf16` |" in page
    assert [span for span in re.findall(r"`[^`\n]+`", page) if "\\" in span] == []


@pytest.mark.parametrize("module", ["qrnn.__main__", "qrnn.bench.__main__"])
def test_terminal_help_is_plain_text(module, capsys):
    """`python -m qrnn --help` and `python -m qrnn.bench --help` show their docstrings without
    reStructuredText's ``literal`` markup."""
    import importlib

    with pytest.raises(SystemExit):
        importlib.import_module(module).main(["--help"])
    out = capsys.readouterr().out
    assert out.startswith("usage: python -m qrnn")
    assert "``" not in out and ":class:" not in out, out


def test_built_site_is_ignored_by_git():
    """`mkdocs build` writes site/ at the repository's root: not a file to commit."""
    assert "site/" in (REPO / ".gitignore").read_text().splitlines()


def test_install_commands_are_exact_and_counts_are_not_copied():
    """The CPU-only torch is one command to copy, on the README and the install page; the
    install page tells where the test counts come from instead of copying numbers that drift;
    a preset's command line passes no flag the preset sets (`--level word`)."""
    cpu_torch = "pip install torch --index-url https://download.pytorch.org/whl/cpu"
    readme = (REPO / "README.md").read_text()
    assert cpu_torch in readme and cpu_torch in INSTALL
    assert re.search(r"\d[\d,]* passed", INSTALL) is None and "its last line counts the tests" in INSTALL
    for page in PAGES:
        for line in page.read_text().splitlines():
            assert not ("--preset awd" in line and "--level word" in line), (page.name, line)
