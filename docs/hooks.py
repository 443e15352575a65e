"""MkDocs hooks (mkdocs.yml `hooks:`): the site shows facts that live in code or in the
repository's root pages without a second copy of them.

A page holds a marker comment on a line of its own; the build replaces it:

- ``<!-- include: FILE -->``: the repository-root Markdown file FILE (README.md,
  BENCHMARKS.md, CHANGELOG.md), its links rewritten from the repository's layout to the
  site's (``docs/<page>.md`` -> ``<page>.md``, ``BENCHMARKS.md`` -> ``benchmarks.md``);
- ``<!-- generated: qrnn-train flags -->``: every ``qrnn-train`` flag from the parser that
  :class:`qrnn.train.Settings` builds;
- ``<!-- generated: op schemas -->``: every ``qrnn::`` op's schema from the C++ manifests
  (``qrnn._C.op_schemas()``);
- ``<!-- generated: qrnn-generate help -->`` (and ``python -m qrnn help``, ``python -m
  qrnn.bench help``): the command's ``--help``.

``tests/packaging/test_site.py`` renders the same markers to check what they produce.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
MARKER = re.compile(r"^<!-- (include|generated): (.+?) -->$", flags=re.M)
# Repository-root pages and the site page that shows each.
ROOT_PAGES = {"README.md": "index.md", "BENCHMARKS.md": "benchmarks.md", "CHANGELOG.md": "changelog.md"}
LINK = re.compile(r"(\]\()([^)#\s]+)")


def site_link(target: str, source_dir: str, page_dir: str) -> str:
    """A link written in a file of the repository folder `source_dir`, as the site page in
    `page_dir` (a folder of docs/) reaches it: links into docs/ and to the root pages the site
    shows are rewritten, anything else is left as written."""
    if "://" in target or target.startswith(("#", "mailto:")):
        return target
    resolved = os.path.normpath(os.path.join(source_dir, target))
    if resolved in ROOT_PAGES:
        site_path = ROOT_PAGES[resolved]
    elif resolved.startswith("docs/"):
        site_path = resolved[len("docs/"):]
    else:
        return target
    return os.path.relpath(site_path, page_dir or ".")


def rewrite_links(text: str, source_dir: str, page_dir: str) -> str:
    return LINK.sub(lambda m: m.group(1) + site_link(m.group(2), source_dir, page_dir), text)


def include(name: str, page_dir: str = "") -> str:
    if name not in ROOT_PAGES:
        raise ValueError(f"docs/hooks.py: cannot include {name!r}: only {sorted(ROOT_PAGES)}")
    return rewrite_links((REPO / name).read_text(), "", page_dir)


def flags_table() -> str:
    """qrnn-train's flags, group by group, as the parser built from Settings has them."""
    from qrnn.train.settings import Settings, build_parser

    resume = {"--" + f.name.replace("_", "-"): f.metadata["resume"] for f in dataclasses.fields(Settings)}
    meaning = {"fixed": "fixed by the checkpoint", "kept": "the checkpoint's, unless given", None: "a run option"}
    parser = build_parser()
    lines = []
    for group in parser._action_groups:
        actions = [a for a in group._group_actions if a.option_strings and not isinstance(a, argparse._HelpAction)]
        if not actions:
            continue
        lines += [f"### {group.title}", "", "| flag | what it sets | on `--resume` |", "|---|---|---|"]
        for action in actions:
            flag = action.option_strings[-1]
            if action.choices:
                # Bare bars: a table splits no cell at a bar inside a code span, where an escaping backslash shows.
                flag += " " + "|".join(str(c) for c in action.choices)
            elif action.nargs != 0:
                flag += f" {action.metavar or action.dest.upper()}"
            text = (action.help or "").replace("|", "\\|").replace("*", "\\*")
            lines.append(f"| `{flag}` | {text} | {meaning[resume.get(action.option_strings[-1])]} |")
        lines.append("")
    return "\n".join(lines)


def schemas_table() -> str:
    """Every qrnn:: op's schema, from the C++ manifests."""
    from qrnn import _C

    return "\n".join(f"- `qrnn::{schema}`" for schema in _C.op_schemas().values())


def command_help(main) -> str:
    """A command's --help, as it prints it, in a code block."""
    import contextlib
    import io

    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.suppress(SystemExit):
        main(["--help"])
    return "```\n" + out.getvalue().rstrip() + "\n```"


def _generate_help() -> str:
    from qrnn.train.generate import generate_main
    return command_help(generate_main)


def _qrnn_help() -> str:
    from qrnn.__main__ import main
    return command_help(main)


def _bench_help() -> str:
    from qrnn.bench.__main__ import main
    return command_help(main)


GENERATED = {"qrnn-train flags": flags_table, "op schemas": schemas_table, "qrnn-generate help": _generate_help,
             "python -m qrnn help": _qrnn_help, "python -m qrnn.bench help": _bench_help}


def render(markdown: str, page_dir: str = "") -> str:
    """The site page docs/`page_dir`/... : its links rewritten for the site, then every
    marker replaced."""
    markdown = rewrite_links(markdown, os.path.join("docs", page_dir) if page_dir else "docs", page_dir)

    def replace(match: re.Match) -> str:
        kind, what = match.groups()
        if kind == "include":
            return include(what, page_dir)
        if what not in GENERATED:
            raise ValueError(f"docs/hooks.py: no generator for {what!r}: {sorted(GENERATED)}")
        return GENERATED[what]()
    return MARKER.sub(replace, markdown)


def on_page_markdown(markdown, page, config, files):  # mkdocs hook
    return render(markdown, os.path.dirname(page.file.src_uri))
