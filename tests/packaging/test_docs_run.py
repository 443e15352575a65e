"""Every Python code block of README.md, CHANGELOG.md, BENCHMARKS.md and of every page of the
documentation site (docs/) runs as written: the blocks of one page run in order in one
namespace, in a fresh folder, as a reader pasting them would run them. A block that needs a
GPU (it moves tensors to ``cuda``) or an optional package that is not installed is skipped
with the reason; any other failure fails the test."""

import pathlib
import re

import pytest
import torch

ROOT = pathlib.Path(__file__).resolve().parents[2]
PAGES = [ROOT / "README.md", ROOT / "CHANGELOG.md", ROOT / "BENCHMARKS.md", *sorted((ROOT / "docs").rglob("*.md"))]
BLOCK = re.compile(r"^```python\n(.*?)^```", flags=re.S | re.M)
NEEDS_GPU = re.compile(r"\.cuda\(|device=[\"']cuda|\.to\([\"']cuda")
OPTIONAL = ("onnx", "onnxscript", "onnxruntime", "lightning")


def _blocks(page: pathlib.Path) -> list:
    text = page.read_text()
    return [(text.count("\n", 0, m.start()) + 2, m.group(1)) for m in BLOCK.finditer(text)]


@pytest.mark.parametrize("page", [p for p in PAGES if _blocks(p)], ids=lambda p: str(p.relative_to(ROOT)))
def test_page_code_runs(page, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    namespace: dict = {"__name__": "__docs__"}
    for line, code in _blocks(page):
        if NEEDS_GPU.search(code) and not torch.cuda.is_available():
            pytest.skip(f"{page.name} line {line}: needs a GPU")
        try:
            exec(compile(code, f"{page.name}:{line}", "exec"), namespace)
        except ModuleNotFoundError as e:
            if e.name and e.name.split(".")[0] in OPTIONAL:
                pytest.skip(f"{page.name} line {line}: needs {e.name}, not installed")
            raise
