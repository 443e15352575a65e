"""A checkpoint is untrusted input: what a crafted file can make ``qrnn-train --resume`` and
``qrnn-generate`` do. Every crafted file is tried in one subprocess under an address-space
limit: each is refused in one line naming what to do, and the refusals take the process's
resident memory less than 300 MB beyond what importing torch and qrnn took (before these
checks, files like these made it read /dev/zero, allocate 6 GB for a model or hang
encoding a history)."""

import json
import os
import shutil
import subprocess
import sys
import textwrap

import pytest
import torch

import qrnn
from qrnn.checkpoint import load
from qrnn.train.cli import main as train_main
from qrnn.train.data import default_text

TINY = ["--layers", "2", "--hidden", "32", "--emsize", "16", "--batch-size", "8", "--bptt", "16",
        "--warmup", "5", "--no-progress", "--sample-length", "0"]

CHILD = textwrap.dedent("""
    import contextlib, io, json, resource, sys
    from qrnn.train.cli import main
    from qrnn.train.generate import generate_main

    def status_mb(field):
        with open("/proc/self/status") as status:
            return next(int(line.split()[1]) for line in status if line.startswith(field + ":")) / 1024

    imported_mb = status_mb("VmRSS")  # torch and qrnn loaded: 0.6 GB for a CUDA build of torch
    # A safety net, not the measure: 2 GiB of address space beyond what the imports mapped
    # (a CUDA build of torch maps several GiB it never touches).
    with open("/proc/self/status") as status:
        mapped = next(int(line.split()[1]) for line in status if line.startswith("VmSize:")) * 1024
    resource.setrlimit(resource.RLIMIT_AS, (mapped + (2 << 30), mapped + (2 << 30)))
    results = []
    for command, argv in json.loads(sys.argv[1]):
        err = io.StringIO()
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
            code = (main if command == "train" else generate_main)(argv)
        results.append([code, err.getvalue()])
    # VmHWM: this process's peak since exec (ru_maxrss would start at the forking parent's).
    print(json.dumps({"results": results, "peak_mb": status_mb("VmHWM"), "imported_mb": imported_mb}))
""")


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """(data file, run folder, its checkpoint's path): three steps of a tiny model."""
    root = tmp_path_factory.mktemp("untrusted")
    data = root / "data" / "tiny.txt"
    data.parent.mkdir()
    data.write_text(default_text()[:12000], encoding="utf-8")
    run = root / "run"
    assert train_main(["--data", str(data), "--max-steps", "3", "--checkpoint-dir", str(run)] + TINY) == 0
    with qrnn.checkpoint.AsyncCheckpointer(run) as scanner:
        return data, run, scanner.latest()


def _crafted(tmp_path, source: str, name: str, edit) -> str:
    """A run folder holding `source`'s checkpoint changed by `edit(state)`."""
    folder = tmp_path / name
    folder.mkdir()
    state = load(source)
    edit(state)
    torch.save(state, folder / os.path.basename(source))
    return str(folder)


def _nest(levels: int):
    """A list standing for 2**levels lists: each level refers twice to the one below."""
    tree: list = []
    for _ in range(levels):
        tree = [tree, tree]
    return tree


def test_crafted_checkpoints_are_refused_in_one_line_within_bounded_memory(trained, tmp_path):
    data, run, checkpoint = trained
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    same_size = tmp_path / "same-size.txt"
    same_size.write_bytes(data.read_bytes().replace(b"e", b"a"))

    def setting(**values):
        return lambda state: state["settings"].update(values)

    def swap_optimizer_tensor(state):
        first = state["optimizer"]["state"][0]
        first["exp_avg"] = torch.randn(3, 5)

    cases = {  # name: (command, edit, fragment of the one-line error)
        "data names a device": ("train", setting(data="/dev/zero"), "/dev/zero is not a regular file"),
        "data names a FIFO": ("train", setting(data=str(fifo)), "is not a regular file"),
        "data names other text": ("train", setting(data=str(same_size)), "its content differs"),
        "sizes beyond the tensors": ("train", setting(hidden=16000, emsize=16000),
                                     "by its settings"),
        "sizes for generate": ("generate", lambda s: s["model_config"].update(hidden=16000, emsize=16000),
                               "by its settings"),
        "a history of 2**40 lists": ("train", lambda s: s.update(history=_nest(40)), "expand to more than"),
        "a setting of the wrong type": ("train", setting(bptt="16"), "--bptt is damaged"),
        "a negative size": ("train", setting(layers=-2), "--layers is damaged"),
        "a data path that is no path": ("train", setting(data=7), "--data is damaged"),
        "optimizer state of another shape": ("train", swap_optimizer_tensor, "the optimizer's exp_avg"),
        "history records of another kind": ("train", lambda s: s.update(history=[{"epoch": 1, "x": [1]}]),
                                            "history is damaged"),
        "vocabulary of another size": ("generate", lambda s: s["vocab"].update(tokens=s["vocab"]["tokens"][:-1]),
                                       "vocabulary has"),
    }
    runs = []
    for index, (command, edit, _) in enumerate(cases.values()):
        folder = _crafted(tmp_path, checkpoint, f"case{index}", edit)
        runs.append([command, ["--checkpoint-dir", folder, "--resume", "--no-progress"] if command == "train"
                     else ["--checkpoint", folder]])
    child = subprocess.run([sys.executable, "-c", CHILD, json.dumps(runs)], capture_output=True, text=True,
                           timeout=300)
    assert child.returncode == 0, child.stderr[-3000:]
    report = json.loads(child.stdout.strip().splitlines()[-1])
    for (name, (_, _, fragment)), (code, err) in zip(cases.items(), report["results"]):
        assert code == 2 and fragment in err and err.count("\n") == 1, (name, err)
    # What the refusals themselves allocated, beyond torch's and qrnn's import (350 MB in all
    # with a CPU build of torch 2.13; before the checks, these files made it allocate 6 GB).
    assert report["peak_mb"] - report["imported_mb"] < 300, report


def test_a_resume_without_data_trusts_the_recorded_files_only_while_unchanged(trained, tmp_path, capsys):
    data, run, _ = trained
    copy = tmp_path / "run"
    shutil.copytree(run, copy)
    assert train_main(["--checkpoint-dir", str(copy), "--resume", "--max-steps", "4", "--no-progress"]) == 0
    capsys.readouterr()
    moved = tmp_path / "moved.txt"
    shutil.copy(data, moved)
    with open(data, "ab") as fh:  # the file the checkpoint names grows: it differs from its record
        fh.write(b"more text\n")
    try:
        assert train_main(["--checkpoint-dir", str(copy), "--resume", "--max-steps", "5", "--no-progress"]) == 2
        err = capsys.readouterr().err
        assert "its size differs" in err and "pass --data PATH" in err and err.count("\n") == 1
        # The user's --data is the user's choice: the same text elsewhere resumes.
        assert train_main(["--data", str(moved), "--checkpoint-dir", str(copy), "--resume", "--max-steps", "5",
                           "--no-progress"]) == 0
    finally:
        shutil.copy(moved, data)
