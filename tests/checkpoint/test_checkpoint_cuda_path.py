"""The checkpoint writer's GPU staging path, run on a machine without a GPU.

Saving CUDA tensors takes its own path: a pinned staging image, device->host copies on a
side stream per device, an event per device that a waiter thread synchronises before it
opens the writer's gate, and (overlap mode) the current streams made to wait for those
events. Here the state's storages are CPU memory labelled as a CUDA device, and torch.cuda's
streams, events and pinned allocation are stand-ins (qrnn.checkpoint.staging.cuda), so every line of
that path runs and the file it writes is checked byte for byte.
"""

from __future__ import annotations

import contextlib

import pytest
import torch

from qrnn import _C
from qrnn.checkpoint import AsyncCheckpointer, CheckpointError, checkpointer, staging

GPU = torch.device("cuda", 0)


class FakeEvent:
    def __init__(self, fail: bool):
        self.fail, self.recorded_on = fail, None

    def record(self, stream):
        self.recorded_on = stream

    def synchronize(self):
        if self.fail:
            raise RuntimeError("device lost")


class FakeStream:
    def __init__(self, device):
        self.device, self.waited_for = device, []

    def wait_stream(self, other):
        self.waited_for.append(other)

    def wait_event(self, event):
        self.waited_for.append(event)


class FakeCuda:
    def __init__(self):
        self.fail = False
        self.events: list = []
        self.current: dict = {}
        self.pinned = 0

    def Stream(self, device):
        return FakeStream(device)

    def Event(self):
        event = FakeEvent(self.fail)
        self.events.append(event)
        return event

    def current_stream(self, device):
        return self.current.setdefault(device, FakeStream(device))

    def stream(self, stream):
        return contextlib.nullcontext()

    def pinned_empty(self, nbytes):
        self.pinned += 1
        return torch.empty(nbytes, dtype=torch.uint8)


@pytest.fixture
def fake_gpu(monkeypatch):
    """Storages of tensors named in `on_gpu` (by identity) are saved as if on cuda:0."""
    fake = FakeCuda()
    fake.on_gpu = set()
    monkeypatch.setattr(staging, "cuda", fake)
    pickle_state = checkpointer.pickle_state

    def labelled(state):
        data, stored = pickle_state(state)
        for s in stored:
            if s.storage.data_ptr() in fake.on_gpu:
                s.device = GPU
        return data, stored

    monkeypatch.setattr(checkpointer, "pickle_state", labelled)
    return fake


def test_gpu_tensors_staged_through_side_streams(fake_gpu, tmp_path):
    state = {"w": torch.randn(300, 7), "b": torch.arange(10), "cpu": torch.randn(5)}
    fake_gpu.on_gpu = {state["w"].untyped_storage().data_ptr(), state["b"].untyped_storage().data_ptr()}
    with AsyncCheckpointer(tmp_path, keep_last=None) as ckpt:
        handle = ckpt.save(state, 1)
        handle.result()
        assert len(fake_gpu.events) == 1 and fake_gpu.events[0].recorded_on is not None
        assert fake_gpu.pinned == 1  # a pinned image, allocated once
        ckpt.save(state, 2).result()
        assert fake_gpu.pinned == 1
    for step in (1, 2):
        loaded = torch.load(tmp_path / _C.checkpoint_file_name("ckpt-", step, ".pt"), weights_only=True)
        for name, tensor in state.items():
            assert torch.equal(loaded[name], tensor)


def test_overlap_mode_makes_the_current_stream_wait(fake_gpu, tmp_path):
    w = torch.nn.Parameter(torch.randn(64, 8))
    opt = torch.optim.SGD([w], lr=0.1)
    fake_gpu.on_gpu = {w.untyped_storage().data_ptr()}
    expected = w.detach().clone()
    with AsyncCheckpointer(tmp_path) as ckpt:
        handle = ckpt.save({"w": w}, 3, overlap_with=opt)
        w.grad = torch.ones_like(w)
        opt.step()  # waits for the snapshot: the current stream waits for the copy's event
        handle.result()
        assert fake_gpu.events[0] in fake_gpu.current[GPU].waited_for
        path = handle.path
    assert torch.equal(torch.load(path, weights_only=True)["w"], expected)


def test_a_failed_gpu_copy_fails_its_save(fake_gpu, tmp_path):
    state = {"w": torch.randn(50)}
    fake_gpu.on_gpu = {state["w"].untyped_storage().data_ptr()}
    fake_gpu.fail = True
    with AsyncCheckpointer(tmp_path) as ckpt:
        handle = ckpt.save(state, 4)
        with pytest.raises(CheckpointError, match="GPU copy failed"):
            handle.result()
        fake_gpu.fail = False  # reported by result(): the next save goes ahead
        assert ckpt.save(state, 5).result()
