"""Sharded checkpoints through qrnn.checkpoint.dcp on gloo processes on the CPU: a model under
FSDP2 saved on 2 ranks resumes on 1 and on 4 (resharding), and each continued run ends at
the parameters of the run that never stopped; DCP's own reader reads the folder, and qrnn's
reader reads DCP's own files of the same state. The save
happens with ``async_save`` followed at once by an optimizer step, so a checkpoint holding
values from after the call would make the continued runs diverge.

The 2-rank training runs once for the module (about 7 s on two cores); each resume is a
few seconds more.
"""

import os
import subprocess
import sys
import textwrap

import dcp_launch
import pytest
import torch
import torch.distributed as dist

try:  # FSDP2's public home: torch >= 2.6
    from torch.distributed.fsdp import fully_shard  # noqa: F401
    HAS_FSDP2 = True
except ImportError:
    HAS_FSDP2 = False

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not dist.is_available() or not dist.is_gloo_available() or not HAS_FSDP2,
                       reason="needs torch.distributed with gloo and FSDP2 (fully_shard, torch >= 2.6)"),
]


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    root = tmp_path_factory.mktemp("dcp-sharded")
    dcp_launch.run("train", 2, root, root)
    return root


def assert_same_parameters(got: dict, want: dict) -> None:
    assert got.keys() == want.keys()
    for name in want:
        torch.testing.assert_close(got[name], want[name], rtol=1e-12, atol=1e-12, msg=name)


def test_saved_on_two_ranks_only_the_committed_step_folder_is_latest(trained):
    from qrnn.checkpoint import dcp as qdcp
    latest = qdcp.latest(trained)
    assert latest == str(trained / "step-000000000003")
    assert sorted(os.listdir(latest)) == [".metadata", "__0_0.distcp", "__1_0.distcp"]


@pytest.mark.parametrize("world", [1, 4])
def test_resumes_on_another_number_of_ranks(trained, world):
    dcp_launch.run("resume", world, trained, trained)
    got = torch.load(trained / f"resumed-{world}-step-000000000003.pt", weights_only=True)
    assert_same_parameters(got, torch.load(trained / "final-2.pt", weights_only=True))


def test_plain_dcp_without_qrnn_reads_the_folder(trained):
    """DCP's own FileSystemReader (no qrnn import in that process) converts the folder; it
    holds what qrnn's reader loads, and what DCP's own writer saved of the same state."""
    out = trained / "plain.pt"
    script = textwrap.dedent(f"""
        import sys
        from torch.distributed.checkpoint.format_utils import dcp_to_torch_save
        dcp_to_torch_save({str(trained / 'step-000000000003')!r}, {str(out)!r})
        assert not any(m == "qrnn" or m.startswith("qrnn.") for m in sys.modules), "qrnn was imported"
    """)
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    plain = torch.load(out, weights_only=False)
    from qrnn.checkpoint import dcp as qdcp
    for folder in (trained / "step-000000000003", trained / "dcp-own"):  # ours, then DCP's own files
        mine = {"model": {name: torch.empty_like(value) for name, value in plain["model"].items()}}
        qdcp.load(mine, checkpoint_id=folder)
        for name, value in plain["model"].items():
            assert torch.equal(mine["model"][name], value), (folder, name)
    assert plain["optim"]["state"], "the optimizer state was saved"
