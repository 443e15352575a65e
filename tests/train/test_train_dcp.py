"""qrnn-train --checkpoint-format dcp: every rank writes its part of a
torch.distributed.checkpoint step folder (qrnn.checkpoint.dcp); resuming reads it on the
same or another number of processes, bit-identically to a file-format run."""

import os
import subprocess
import sys

import pytest
import torch.distributed as dist

from conftest import assert_same_training_state
from qrnn.train import main as train_main
from qrnn.train.checkpoints import load_checkpoint
from qrnn.train.data import default_text
from qrnn.train.runs import latest_checkpoint

pytestmark = [pytest.mark.slow, pytest.mark.skipif(not dist.is_available(), reason="needs torch.distributed")]

TINY = ["--layers", "2", "--hidden", "32", "--emsize", "16", "--batch-size", "8", "--bptt", "16",
        "--warmup", "5", "--lr", "3e-3", "--no-progress", "--sample-length", "0", "--precision", "fp32"]


@pytest.fixture(scope="module")
def tiny_data(tmp_path_factory):
    path = tmp_path_factory.mktemp("data") / "tiny.txt"
    path.write_text(default_text()[:6_000], encoding="utf-8")
    return str(path)


def test_resume_from_step_folders_is_bit_identical_to_a_file_format_run(tiny_data, tmp_path, capsys):
    fresh = ["--data", tiny_data] + TINY
    files, split = str(tmp_path / "files"), str(tmp_path / "split")
    assert train_main(fresh + ["--epochs", "2", "--checkpoint-dir", files]) == 0
    assert train_main(fresh + ["--epochs", "1", "--checkpoint-dir", split, "--checkpoint-format", "dcp"]) == 0
    first = latest_checkpoint(split)
    assert os.path.basename(first).startswith("step-") and sorted(os.listdir(first))[0] == ".metadata"
    assert train_main(["--resume", "--no-progress", "--sample-length", "0", "--epochs", "2",
                       "--checkpoint-dir", split]) == 0  # the format is the checkpoint's
    out = capsys.readouterr().out
    assert "best.pt" not in out.splitlines()[-1]
    latest = latest_checkpoint(split)
    assert latest != first and os.path.basename(latest).startswith("step-")
    assert not any(name.endswith(".pt") for name in os.listdir(split))
    assert_same_training_state(load_checkpoint(latest_checkpoint(files)), load_checkpoint(latest))


def test_two_processes_save_sharded_and_one_resumes(tiny_data, tmp_path):
    """Under DDP every rank saves its part of the step folder; a single process resumes it."""
    run_dir = str(tmp_path / "ddp")
    env = dict(os.environ, OMP_NUM_THREADS="1")
    launch = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
              "-m", "qrnn.train", "--data", tiny_data, "--checkpoint-dir", run_dir, "--checkpoint-format", "dcp"]
    first = subprocess.run(launch + TINY + ["--max-steps", "6"], capture_output=True, text=True, env=env, timeout=300)
    assert first.returncode == 0, first.stderr[-3000:]
    folder = latest_checkpoint(run_dir)
    assert os.path.basename(folder) == "step-000000000006"
    assert {"__0_0.distcp", "__1_0.distcp", ".metadata"} <= set(os.listdir(folder))
    saved = load_checkpoint(folder)
    assert saved["progress"]["step"] == 6 and saved["progress"]["world"] == 2 and len(saved["rng"]) == 2
    second = subprocess.run([sys.executable, "-m", "qrnn.train", "--resume", "--checkpoint-dir", run_dir,
                             "--max-steps", "10", "--no-progress", "--sample-length", "0"],
                            capture_output=True, text=True, env=env, timeout=300)
    assert second.returncode == 0, second.stderr[-3000:]
    assert "resuming step-000000000006" in second.stdout
    assert load_checkpoint(latest_checkpoint(run_dir))["progress"]["step"] == 10
