"""The training code's CUDA-only branches, run on a machine without a GPU.

A stand-in for torch.cuda (available, N devices, bfloat16 support, RNG state) and for the
process-group start lets these branches run as they would on a GPU machine: device choice
per rank, the nccl backend, the precision rule, the CUDA RNG in checkpoints. Training
itself on a GPU runs in the `cuda` tests.
"""

from __future__ import annotations

from datetime import timedelta

import pytest
import torch

from qrnn.train import TrainError, choose_precision, init_distributed
from qrnn.train.state import rng_state, set_rng_state


class FakeCuda:
    """torch.cuda's lookups, recorded."""

    def __init__(self, monkeypatch, devices=2, bf16=True):
        self.calls: list = []
        self.rng = {}
        for name, fn in {
            "is_available": lambda: devices > 0,
            "device_count": lambda: devices,
            "current_device": lambda: 0,
            "set_device": lambda d: self.calls.append(("set_device", torch.device(d))),
            "is_bf16_supported": lambda *a, **k: bf16,
            "get_rng_state": lambda d=None: self.rng.get(str(d), torch.arange(4, dtype=torch.uint8)),
            "set_rng_state": lambda s, d=None: self.rng.__setitem__(str(d), s.clone()),
        }.items():
            monkeypatch.setattr(torch.cuda, name, fn)
        monkeypatch.setattr(torch.distributed, "is_initialized", lambda: False)
        monkeypatch.setattr(torch.distributed, "init_process_group",
                            lambda backend, timeout: self.calls.append(("init_process_group", backend, timeout)))
        monkeypatch.setattr(torch.distributed, "new_group",
                            lambda backend, timeout: self.calls.append(("new_group", backend, timeout)))


def test_precision_rule_on_cuda(monkeypatch):
    cuda = torch.device("cuda", 0)
    FakeCuda(monkeypatch, bf16=True)
    assert choose_precision("auto", cuda)[0] == "fp16"
    assert choose_precision("bf16", cuda) == ("bf16", "requested")
    FakeCuda(monkeypatch, bf16=False)
    with pytest.raises(TrainError, match="no bfloat16 support"):
        choose_precision("bf16", cuda)


def test_each_rank_takes_its_own_gpu_and_nccl(monkeypatch):
    fake = FakeCuda(monkeypatch, devices=2)
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("LOCAL_RANK", "1")
    dist = init_distributed()  # no --device: CUDA when available
    assert dist.device == torch.device("cuda", 1) and dist.rank == 1 and dist.world == 2
    # The process group's timeout is --dist-timeout's default (5 minutes), the health group gloo.
    limit = timedelta(seconds=300)
    assert fake.calls == [("set_device", torch.device("cuda", 1)), ("init_process_group", "nccl", limit),
                          ("new_group", "gloo", limit)]


def test_single_process_uses_the_current_gpu_and_checks_the_index(monkeypatch):
    fake = FakeCuda(monkeypatch, devices=2)
    for name in ("WORLD_SIZE", "RANK", "LOCAL_RANK"):
        monkeypatch.delenv(name, raising=False)
    assert init_distributed("cuda").device == torch.device("cuda", 0)
    assert fake.calls == [("set_device", torch.device("cuda", 0))]
    with pytest.raises(TrainError, match="sees 2 CUDA device"):
        init_distributed("cuda:5")
    FakeCuda(monkeypatch, devices=0)
    with pytest.raises(TrainError, match="no CUDA device"):
        init_distributed("cuda")


def test_checkpoints_carry_the_cuda_rng(monkeypatch):
    fake = FakeCuda(monkeypatch)
    device = torch.device("cuda", 1)
    state = rng_state(device)
    assert torch.equal(state["cuda"], torch.arange(4, dtype=torch.uint8))
    state["cuda"] = torch.full((4,), 7, dtype=torch.uint8)
    set_rng_state(state, device)
    assert torch.equal(fake.rng[str(device)], state["cuda"])
