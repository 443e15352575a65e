"""A C++ program (tests/cpp_consumer/checkpoint_consumer.cpp, linked against the installed
qrnn package) writes checkpoints that plain torch.load reads without qrnn."""

import json
import os
import subprocess
import sys
import zipfile

READER = r"""
import json, sys, torch
out = {}
for mode, kwargs in {"plain": {}, "mmap": {"mmap": True}}.items():
    s = torch.load(sys.argv[1], weights_only=True, **kwargs)
    out[mode] = {k: [str(v.dtype), list(v.shape), v.float().reshape(-1).tolist()] for k, v in s.items()}
    out[mode]["shares"] = s["weight_t"].untyped_storage().data_ptr() == s["weight"].untyped_storage().data_ptr()
assert "qrnn" not in sys.modules
print(json.dumps(out))
"""


def test_checkpoint_written_from_cpp_loads_in_python(consumer_build, tmp_path):
    exe = consumer_build / "checkpoint_consumer"
    proc = subprocess.run([str(exe), str(tmp_path)], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "checkpoint consumer ok" in proc.stdout and "No such file or directory" in proc.stdout
    path = tmp_path / "from_cpp.pt"
    read = subprocess.run([sys.executable, "-c", READER, str(path)], capture_output=True, text=True, timeout=120)
    assert read.returncode == 0, read.stderr
    weight = [i * 0.25 - 1 for i in range(24)]
    for mode, got in json.loads(read.stdout).items():
        assert got.pop("shares"), mode
        assert got == {
            "weight": ["torch.float32", [6, 4], weight],
            "weight_t": ["torch.float32", [4, 6], [weight[i + 4 * j] for i in range(4) for j in range(6)]],
            "row2": ["torch.float32", [4], weight[8:12]],
            "step": ["torch.int64", [], [42.0]],
            "bias_bf16": ["torch.bfloat16", [3], [1.0, 2.0, -1.0]],
            "mask": ["torch.bool", [2, 2], [1.0, 0.0, 1.0, 1.0]],
        }, mode
    assert zipfile.ZipFile(path).testzip() is None
    assert sorted(n for n in os.listdir(tmp_path) if n.startswith("ckpt-")) == [
        "ckpt-000000000003.pt", "ckpt-000000000004.pt"]
    assert not (tmp_path / "missing").exists()
