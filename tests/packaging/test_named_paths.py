"""Every repository path that the documentation or a comment names exists.

Where it looks:

- Markdown (README.md, CHANGELOG.md, BENCHMARKS.md, docs/**/*.md and any other tracked
  ``.md`` file, such as a folder's notes): inline code spans,
  fenced code blocks and the targets of relative links. A link target (``[text](target)``)
  is resolved from the page's folder, as a reader's browser resolves it; anything else is
  read from the repository root.
- Tracked source files (``git ls-files`` when the checkout has ``.git``, else a walk): in
  Python, comments and docstrings (every string statement, module, class, function and
  attribute docstrings alike); in C, C++ and CUDA (``.c .cc .cpp .h .hpp .cu .cuh`` and
  ``.cpp.in``), ``//`` and ``/* */`` comments; in shell scripts (``.sh`` or a shell
  ``#!`` line), CMake (``CMakeLists.txt``, ``.cmake``, ``.cmake.in``), TOML and YAML,
  ``#`` comments. Other string literals and code are not read: they hold data (temporary
  folders, the installed wheel's layout), not references for a reader.

What counts as a repository path: a token that starts with one of the repository's
top-level folders followed by ``/`` (read from the checkout: ``cpp/``, ``cuda/``,
``python/``, ``tests/``, ``tools/``, ``docs/``, ``cmake/``, ``.ci/``, ...) or is one of its
top-level files (``CMakeLists.txt``, ``pyproject.toml``, ``BENCHMARKS.md``, ...), and is
not glued to a longer path (no ``/``, ``.``, ``-``, ``~``, ``$``, word character, ``}`` or
``>`` right before it), so ``site-packages/qrnn/lib``, ``build/tests/x``, a URL's
``.../tree/main/docs/x`` or ``$PREFIX/cmake/x`` are not repository paths. Paths of the
installed package (``qrnn/lib``, ``qrnn/include``) do not start with a top-level folder
and are never checked. Trailing punctuation (``. , ; : )``) is not part of the token, nor
is a ``#anchor`` or a ``:line`` suffix.

Patterns: ``*``, ``**`` and ``?`` are globs; ``{a,b}`` expands to each alternative; a
placeholder ``<name>`` or ``{name}`` (no comma inside) stands for any name and is a ``*``.
A pattern must match at least one path. A token holding ``...`` (an elided path) is
skipped.

Each failure is reported as ``file:line: names <path>, which does not exist``.
"""

from __future__ import annotations

import ast
import glob
import io
import os
import pathlib
import re
import subprocess
import tokenize

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]

C_SUFFIXES = (".c", ".cc", ".cpp", ".h", ".hpp", ".cu", ".cuh", ".cpp.in")
HASH_SUFFIXES = (".sh", ".cmake", ".cmake.in", ".toml", ".yml", ".yaml")
TRAILING = ".,;:)?!"


def _tracked_files() -> list[str]:
    if (ROOT / ".git").exists():
        listed = subprocess.run(["git", "-C", str(ROOT), "ls-files", "-z"], capture_output=True, timeout=120)
        if listed.returncode == 0:
            return [name for name in listed.stdout.decode().split("\0") if name]
    skip = {".git", ".venv", "build", "_skbuild", "dist", "__pycache__", ".pytest_cache", ".hypothesis"}
    found = []
    for folder, dirs, files in os.walk(ROOT):
        dirs[:] = [d for d in dirs if d not in skip and not d.startswith(".venv") and not d.endswith(".egg-info")]
        found += [os.path.relpath(os.path.join(folder, f), ROOT) for f in files]
    return found


TRACKED = _tracked_files()
TOP_DIRS = sorted({name.split("/", 1)[0] for name in TRACKED if "/" in name})
TOP_FILES = sorted({name for name in TRACKED if "/" not in name})
_PREFIX = "|".join([re.escape(d) + "/" for d in TOP_DIRS] + [re.escape(f) + r"(?![\w.-])" for f in TOP_FILES])
TOKEN = re.compile(rf"(?<![\w./~$}}>-])(?:{_PREFIX})[\w./*?{{}}<>,+-]*")
# A token ends at the first character that cannot be in a path here; commas only inside {a,b}.


def _clean(token: str) -> str:
    """The token without what follows a path in prose: trailing punctuation, and a comma
    outside braces (``cpp/include/qrnn/<file>.hpp,`` in prose)."""
    depth = 0
    for i, ch in enumerate(token):
        depth += ch == "{"
        depth -= ch == "}"
        if ch == "," and depth <= 0:
            token = token[:i]
            break
    while token and token[-1] in TRAILING:
        token = token[:-1]
    if token.count("{") != token.count("}"):  # an unbalanced brace is prose, not a pattern
        token = token[:token.index("{")] if "{" in token else token[:token.index("}")]
    return token


def _expand(pattern: str) -> list[str]:
    """``{a,b}`` alternatives expanded; ``{name}`` and ``<name>`` placeholders as ``*``."""
    pattern = re.sub(r"<[^<>/]*>", "*", pattern)
    brace = re.search(r"\{([^{}]*)\}", pattern)
    if brace is None:
        return [pattern]
    choices = brace.group(1).split(",") if "," in brace.group(1) else ["*"]
    return [expanded for choice in choices
            for expanded in _expand(pattern[:brace.start()] + choice + pattern[brace.end():])]


def _exists(path: str, base: pathlib.Path) -> bool:
    for candidate in _expand(path):
        full = str(base / candidate)
        if any(ch in candidate for ch in "*?["):
            if not glob.glob(full, recursive=True):
                return False
        elif not os.path.lexists(full):
            return False
    return True


def _tokens(text: str):
    """(offset, token) of every repository path in ``text``."""
    for found in TOKEN.finditer(text):
        if "..." in found.group(0):
            continue
        token = _clean(found.group(0))
        if token:
            yield found.start(), token


# ---- where the tokens are ---------------------------------------------------------------

def _python_texts(source: str):
    """(line, text) of the comments and string statements (docstrings) of a Python file."""
    try:
        for tok in tokenize.generate_tokens(io.StringIO(source).readline):
            if tok.type == tokenize.COMMENT:
                yield tok.start[0], tok.string
    except (tokenize.TokenError, SyntaxError):
        pass
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return
    for node in ast.walk(tree):
        if (isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant)
                and isinstance(node.value.value, str)):
            # The literal's own lines: line numbers of the raw text, escapes and all.
            lines = source.splitlines()[node.lineno - 1:node.end_lineno]
            yield node.lineno, "\n".join(lines)


C_COMMENT = re.compile(r'//[^\n]*|/\*.*?\*/|"(?:\\.|[^"\\\n])*"|\'(?:\\.|[^\'\\\n])*\'', re.S)


def _c_texts(source: str):
    for found in C_COMMENT.finditer(source):
        if found.group(0)[0] == "/":
            yield source.count("\n", 0, found.start()) + 1, found.group(0)


HASH_COMMENT = re.compile(r"(?:^|(?<=\s))#[^\n]*", re.M)


def _hash_texts(source: str):
    for found in HASH_COMMENT.finditer(source):
        yield source.count("\n", 0, found.start()) + 1, found.group(0)


INLINE_CODE = re.compile(r"(`+)(.+?)\1", re.S)
FENCE = re.compile(r"^(```|~~~)[^\n]*\n(.*?)^\1", re.S | re.M)
LINK = re.compile(r"\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")


def _markdown_failures(page: str, source: str) -> list[str]:
    failures = []
    base = (ROOT / page).parent
    fenced = list(FENCE.finditer(source))
    spans = [(m.start(2), m.group(2)) for m in fenced]
    outside = FENCE.sub(lambda m: "\n" * m.group(0).count("\n"), source)  # keeps the line numbers
    spans += [(m.start(2), m.group(2)) for m in INLINE_CODE.finditer(outside)]
    for start, text in spans:
        for offset, token in _tokens(text):
            if not _exists(token, ROOT):
                failures.append(_failure(page, source.count("\n", 0, start + offset) + 1, token))
    for link in LINK.finditer(outside):
        target = link.group(1).split("#", 1)[0]
        if not target or re.match(r"^[a-zA-Z][\w+.-]*:", target) or target.startswith("/"):
            continue  # an anchor, a URL (http:, mailto:), or a site-absolute path
        if not os.path.lexists(base / target):
            failures.append(_failure(page, outside.count("\n", 0, link.start()) + 1, target))
    return failures


def _failure(where: str, line: int, path: str) -> str:
    return f"{where}:{line}: names {path}, which does not exist"


def _kind(name: str) -> str | None:
    base = os.path.basename(name)
    if name.endswith(".md"):
        return "markdown"
    if name.endswith(".py"):
        return "python"
    if name.endswith(C_SUFFIXES):
        return "c"
    if base == "CMakeLists.txt" or name.endswith(HASH_SUFFIXES):
        return "hash"
    if "." not in base:  # a script without a suffix: a shell one by its #! line
        try:
            with open(ROOT / name, "rb") as fh:
                first = fh.readline(200)
        except OSError:
            return None
        if first.startswith(b"#!") and re.search(rb"\b(ba|z|da)?sh\b", first):
            return "hash"
    return None


def _file_failures(name: str) -> list[str]:
    kind = _kind(name)
    if kind is None:
        return []
    try:
        source = (ROOT / name).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError):
        return []
    if kind == "markdown":
        return _markdown_failures(name, source)
    texts = {"python": _python_texts, "c": _c_texts, "hash": _hash_texts}[kind](source)
    failures = []
    for line, text in texts:
        for offset, token in _tokens(text):
            if not _exists(token, ROOT):
                failures.append(_failure(name, line + text.count("\n", 0, offset), token))
    return failures


def test_the_scan_reads_this_repository():
    assert {"cpp", "python", "tests", "docs"} <= set(TOP_DIRS), TOP_DIRS
    assert "pyproject.toml" in TOP_FILES
    names = [name for name in TRACKED if _kind(name) is not None]
    assert {"README.md", "python/qrnn/__init__.py", "CMakeLists.txt", "cpp/include/qrnn/forget_mult.hpp"} <= set(names)


@pytest.mark.parametrize("text, tokens", [
    ("see `cpp/src/common/scan.hpp`.", ["cpp/src/common/scan.hpp"]),
    ("# tools/a.sh, tools/b.sh: both", ["tools/a.sh", "tools/b.sh"]),
    ("cuda/{forget_mult,qrnn_gates}/kernels.cuh", ["cuda/{forget_mult,qrnn_gates}/kernels.cuh"]),
    ("site-packages/qrnn/lib and build/tests/x and https://x.org/tree/main/docs/y", []),
    ("$PREFIX/cmake/x and ~/tools/y", []),
    ("pyproject.toml's [tool.mypy]; not pyproject.tomlx", ["pyproject.toml"]),
    ("tests/... and docs/<page>.md#anchor", ["docs/<page>.md"]),
    ("cpp/src/x.cpp:12 (python/qrnn)", ["cpp/src/x.cpp", "python/qrnn"]),
])
def test_tokens(text, tokens):
    assert [token for _, token in _tokens(text)] == tokens


def test_patterns():
    assert _expand("cuda/{a,b}/<x>.cuh") == ["cuda/a/*.cuh", "cuda/b/*.cuh"]
    assert _exists("cuda/<family>/kernels.cuh", ROOT)
    assert _exists("cuda/{forget_mult,qrnn_gates}/kernels.cuh", ROOT)
    assert not _exists("cuda/{forget_mult,no_such_family}/kernels.cuh", ROOT)
    assert _exists("cpp/include/qrnn/*.hpp", ROOT) and not _exists("cpp/include/qrnn/*.no_such_suffix", ROOT)


def test_every_named_repository_path_exists():
    failures = [failure for name in TRACKED for failure in _file_failures(name)]
    assert not failures, "\n".join(failures)
