"""The installed C++ headers (cpp/include/, installed as they are) carry no test switches:
nothing in them, comment or identifier, is marked as there for tests only. Test hooks live
in private headers (cpp/src/, e.g. checkpoint/fault_injection.hpp); an option a user may
set is documented as a user option, with its consequences (docs/ARCHITECTURE.md, "Test
hooks"). Read from the source tree."""

import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
INCLUDE = REPO / "cpp" / "include"
HEADER_SUFFIXES = {".h", ".hpp", ".cuh", ".hh", ".hxx", ".inl"}

# What marks a comment or a name as a test switch.
MARKERS = [
    re.compile(r"\btests?[- ]only\b", re.IGNORECASE),  # "tests only", "test-only"
    re.compile(r"\bonly (for|in|by|from|during) (the |unit )?tests?\b", re.IGNORECASE),  # "off only for tests"
    re.compile(r"\b(for|in) (unit )?testing\b", re.IGNORECASE),  # "for testing"
    re.compile(r"\btest(ing)?[ _-]?(hook|switch|knob|backdoor)s?\b", re.IGNORECASE),  # "test hook", test_switch
    re.compile(r"\b\w*TESTING\w*\b"),  # QRNN_TESTING, TESTING_ONLY (identifiers, case-sensitive)
    re.compile(r"\b(namespace\s+testing|testing::)"),  # qrnn::...::testing
    re.compile(r"\w_for_tests?\b|\bfor_tests?_\w", re.IGNORECASE),  # set_x_for_test, FOR_TESTS_...
]


def headers() -> list:
    return sorted(p for p in INCLUDE.rglob("*") if p.is_file() and p.suffix in HEADER_SUFFIXES)


def test_switch_marks(text: str) -> list:
    """[(line number, line)] of the lines of `text` that mark something as test-only."""
    return [(i, line.strip()) for i, line in enumerate(text.splitlines(), 1)
            if any(m.search(line) for m in MARKERS)]


test_switch_marks.__test__ = False  # a helper, not a test


def test_there_are_headers_to_scan():
    names = {p.relative_to(INCLUDE).as_posix() for p in headers()}
    assert {"qrnn/checkpoint.hpp", "qrnn/forget_mult.hpp", "qrnn/dtype.hpp"} <= names


@pytest.mark.parametrize("path", headers(), ids=lambda p: p.relative_to(INCLUDE).as_posix())
def test_no_test_switch_in_an_installed_header(path):
    hits = [f"{path.relative_to(REPO).as_posix()}:{i}: {line}" for i, line in test_switch_marks(path.read_text())]
    assert hits == [], "test-only switches in an installed header (move them to cpp/src/, or document the " \
                       "option for users):\n" + "\n".join(hits)


@pytest.mark.parametrize("line", [
    "    bool sync = true;       // fsync the file and the folder (off only for tests)",
    "    // rename over `name`, folder fsync (`sync` false skips the fsyncs: tests only). Returns",
    "// A test-only hook: makes the next write fail.",
    "    int delay_ms = 0;  // for testing",
    "#if defined(QRNN_TESTING)",
    "namespace testing {",
    "void set_clock_for_tests(Clock c);",
    "    // Test hook: the writer calls it before each fsync.",
])
def test_the_marks_are_recognised(line):
    assert test_switch_marks(line) == [(1, line.strip())]


@pytest.mark.parametrize("line", [
    "    bool sync = true;  // false skips both fsyncs: for scratch files nobody needs after a crash",
    "// Host-only: what a launch would use (the emulator and the tests call it too).",
    "// Tests: see tests/cpp/test_checkpoint.cpp.",
    "    int64_t latest = 0;  // the newest step",
])
def test_ordinary_lines_pass(line):
    assert test_switch_marks(line) == []
