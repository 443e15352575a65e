"""Checkpoints: qrnn.checkpoint.AsyncCheckpointer against torch.save and
torch.distributed.checkpoint.async_save, all on the same state in the same run.

State: an AWD-QRNN-shaped language model (WikiText-2 vocabulary 33278, embedding 400,
hidden 1550, four QRNN layers, window 2 in the first two, tied decoder) with its Adam
state, about 0.5 GB (``--quick``: a small model, about 30 MB). Figures:

* blocking time of ``save()`` (default mode, and overlap mode where the snapshot overlaps a
  real forward/backward pass and ``optimizer.step()`` waits for it), as a share of torch.save;
* total time until the file is committed (fsynced, renamed, folder fsynced) against
  torch.save plus one fsync;
* DCP async_save's blocking and total time on the same state, for reference;
* ``qrnn.checkpoint.async_save(state, path)`` blocking time against torch.save of the same
  state, and (where Lightning is installed) ``QRNNCheckpointIO``'s two back-to-back saves of
  one checkpoint event (top-k and last) against two torch.saves;
* a short training loop's per-epoch time with a save every epoch (overlap mode) against
  the same loop without saves, alternating epochs (process CPU time reported alongside);
* with ``--checkpoint-sizes 2,5`` (GiB; not in ``--quick``): the *first* save() of a state
  of that size by a fresh checkpointer (staging memory not yet allocated) against
  torch.save + fsync of the same state, and the peak memory it adds, as a share of the state.

Files go to a temporary folder (``QRNN_BENCH_DIR`` to choose where: results depend on the
file system and disk) and are deleted at the end.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import statistics
import tempfile
import time
import warnings

import torch
import torch.nn.functional as F
from torch import nn

import qrnn
from qrnn.checkpoint import AsyncCheckpointer, async_save, wait_all

from .common import Result

AREA = "checkpoint"


class QrnnLanguageModel(nn.Module):
    """AWD-QRNN's shape: embedding -> qrnn.QRNNLayer stack (the last back to the embedding
    size) -> decoder tied to the embedding."""

    def __init__(self, vocab: int, embedding: int, hidden: int, windows=(2, 2, 1, 1)):
        super().__init__()
        sizes = [embedding] + [hidden] * (len(windows) - 1) + [embedding]
        self.embedding = nn.Embedding(vocab, embedding)
        self.layers = nn.ModuleList(qrnn.QRNNLayer(sizes[i], sizes[i + 1], window=w) for i, w in enumerate(windows))
        self.decoder_bias = nn.Parameter(torch.zeros(vocab))

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.embedding(tokens)  # (time, batch, features)
        for layer in self.layers:
            x, _ = layer(x)
        return F.linear(x, self.embedding.weight, self.decoder_bias)


def _state_bytes(state) -> int:
    seen, total = set(), 0

    def walk(obj):
        nonlocal total
        if isinstance(obj, torch.Tensor):
            s = obj.untyped_storage()
            if s._cdata not in seen:
                seen.add(s._cdata)
                total += s.nbytes()
        elif isinstance(obj, dict):
            for v in obj.values():
                walk(v)
        elif isinstance(obj, (list, tuple)):
            for v in obj:
                walk(v)

    walk(state)
    return total


class _Trainer:
    def __init__(self, quick: bool):
        torch.manual_seed(0)
        if quick:
            self.model = QrnnLanguageModel(vocab=6000, embedding=128, hidden=400)
            self.batch, self.bptt = 8, 35
        else:
            self.model = QrnnLanguageModel(vocab=33278, embedding=400, hidden=1550)
            self.batch, self.bptt = 8, 35
        self.vocab = self.model.embedding.num_embeddings
        self.opt = torch.optim.Adam(self.model.parameters(), lr=1e-3)
        self.step()  # creates Adam's state

    def step(self) -> None:
        tokens = torch.randint(0, self.vocab, (self.bptt + 1, self.batch))
        self.opt.zero_grad(set_to_none=True)
        logits = self.model(tokens[:-1])
        F.cross_entropy(logits.reshape(-1, self.vocab), tokens[1:].reshape(-1)).backward()
        self.opt.step()

    def forward_backward(self) -> None:
        tokens = torch.randint(0, self.vocab, (self.bptt + 1, self.batch))
        self.opt.zero_grad(set_to_none=True)
        F.cross_entropy(self.model(tokens[:-1]).reshape(-1, self.vocab), tokens[1:].reshape(-1)).backward()

    def state(self, epoch: int = 0) -> dict:
        return {"model": self.model.state_dict(), "optim": self.opt.state_dict(), "epoch": epoch}


def _fsync(path: str) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _save_figures(trainer: _Trainer, folder: str, rounds: int) -> dict:
    """Interleaved rounds of every contender; medians of each figure (seconds)."""
    import torch.distributed.checkpoint as dcp

    samples: dict = {k: [] for k in ("torch_save", "torch_fsync", "dcp_block", "dcp_total", "default_block",
                               "default_total", "overlap_block", "overlap_total", "async_block", "lightning_block")}
    ckpt = AsyncCheckpointer(os.path.join(folder, "qrnn"), keep_last=1)
    lightning_io = None
    if importlib.util.find_spec("lightning") or importlib.util.find_spec("pytorch_lightning"):
        from qrnn.checkpoint.lightning import QRNNCheckpointIO
        lightning_io = QRNNCheckpointIO()
    for r in range(rounds + 1):  # round 0 warms every path up (allocation, planning caches)
        record = r > 0
        state = trainer.state(r)

        path = os.path.join(folder, f"torch-{r}.pt")
        start = time.perf_counter()
        torch.save(state, path)
        saved = time.perf_counter()
        _fsync(path)
        synced = time.perf_counter()
        os.unlink(path)
        if record:
            samples["torch_save"].append(saved - start)
            samples["torch_fsync"].append(synced - saved)

        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # DCP warns that no process group is set up
            start = time.perf_counter()
            future = dcp.async_save(state, checkpoint_id=os.path.join(folder, f"dcp-{r}"), no_dist=True)
            returned = time.perf_counter()
            (future.upload_completion if hasattr(future, "upload_completion") else future).result()
            finished = time.perf_counter()
        shutil.rmtree(os.path.join(folder, f"dcp-{r}"), ignore_errors=True)
        if record:
            samples["dcp_block"].append(returned - start)
            samples["dcp_total"].append(finished - start)

        path = os.path.join(folder, "async.pt")
        start = time.perf_counter()
        pending = async_save(state, path)
        returned = time.perf_counter()
        pending.result()
        if record:
            samples["async_block"].append(returned - start)

        if lightning_io is not None:  # one ModelCheckpoint event: its top-k file, then last.ckpt
            start = time.perf_counter()
            lightning_io.save_checkpoint(state, os.path.join(folder, f"epoch={r}.ckpt"))
            lightning_io.save_checkpoint(state, os.path.join(folder, "last.ckpt"))
            returned = time.perf_counter()
            lightning_io.teardown()
            lightning_io.remove_checkpoint(os.path.join(folder, f"epoch={r}.ckpt"))
            if record:
                samples["lightning_block"].append(returned - start)

        handle = ckpt.save(state, 2 * r)
        assert handle is not None  # a blocking save always returns its handle
        handle.result()
        if record:
            samples["default_block"].append(handle.blocked_seconds)
            samples["default_total"].append(handle.total_seconds)

        handle = ckpt.save(trainer.state(r), 2 * r + 1, overlap_with=trainer.opt)
        assert handle is not None
        trainer.forward_backward()  # runs while the snapshot is taken
        trainer.opt.step()          # waits for the snapshot if it is not complete yet
        handle.result()
        if record:
            samples["overlap_block"].append(handle.blocked_seconds)
            samples["overlap_total"].append(handle.total_seconds)
    ckpt.close()
    wait_all()
    return {k: statistics.median(v) if v else None for k, v in samples.items()}


def _epoch_figures(trainer: _Trainer, folder: str, steps: int, pairs: int) -> dict:
    """Per-epoch time of the same loop without and with a save (overlap mode) each epoch,
    alternating single epochs so a noisy neighbour hits both alike. A saving epoch starts
    with save(): the snapshot overlaps its first forward/backward and the file is written
    while its steps run; its time also includes waiting for that file at the end (usually
    zero), so no part of a save falls outside the timed epochs."""
    ckpt = AsyncCheckpointer(os.path.join(folder, "epochs"), keep_last=2)
    times: dict = {"plain": [], "save": []}
    cpu: dict = {"plain": [], "save": []}
    for epoch in range(2 * pairs):
        mode = "save" if epoch % 2 else "plain"
        start, start_cpu = time.perf_counter(), time.process_time()
        if mode == "save":
            ckpt.save(trainer.state(epoch), epoch, overlap_with=trainer.opt)
        for _ in range(steps):
            trainer.step()
        ckpt.wait()
        times[mode].append(time.perf_counter() - start)
        cpu[mode].append(time.process_time() - start_cpu)
    ckpt.close()
    figures = {k: statistics.median(v) for k, v in times.items()}
    figures.update({f"{k}_cpu": statistics.median(v) for k, v in cpu.items()})
    figures.update({f"{k}_spread": (min(v), max(v)) for k, v in times.items()})
    return figures


def _rss_bytes(field: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    return 0


def _first_save_figures(gib: float, folder: str) -> dict:
    """A state of `gib` GiB in 256 MiB float32 tensors (a model's parameters): torch.save +
    fsync twice (before and after, the faster counts), and the first and second save() of a
    fresh checkpointer (default mode), with the peak resident memory each adds."""
    piece = 64 << 20  # elements: 256 MiB
    total = int(gib * (1 << 30)) // 4
    state = {f"w{i}": torch.full((min(piece, total - i * piece),), float(i)) for i in range(-(-total // piece))}
    state_bytes = total * 4
    baseline = []

    def torch_save_fsync():
        path = os.path.join(folder, "torch.pt")
        start = time.perf_counter()
        torch.save(state, path)
        _fsync(path)
        baseline.append(time.perf_counter() - start)
        os.unlink(path)

    torch_save_fsync()
    can_reset_peak = os.path.exists("/proc/self/clear_refs")
    out = {}

    def timed_save(ckpt, label, step):
        resident = _rss_bytes("VmRSS")
        if can_reset_peak:
            with open("/proc/self/clear_refs", "w") as f:
                f.write("5")  # resets the peak resident set (VmHWM)
        handle = ckpt.save(state, step)
        out[f"{label}_block"] = handle.blocked_seconds
        handle.result()
        out[f"{label}_total"] = handle.total_seconds
        out[f"{label}_peak"] = (_rss_bytes("VmHWM") - resident) if can_reset_peak else float("nan")
        out[f"{label}_resident"] = resident

    ckpt = AsyncCheckpointer(os.path.join(folder, "first"), keep_last=1)
    timed_save(ckpt, "first", 0)   # nothing allocated ahead
    timed_save(ckpt, "second", 1)  # staging reused
    ckpt.close()
    torch_save_fsync()
    ckpt = AsyncCheckpointer(os.path.join(folder, "reserved"), keep_last=1)
    ckpt.reserve(state, wait=True)  # e.g. during setup, before training starts
    timed_save(ckpt, "reserved", 0)
    ckpt.close()
    out["base"] = min(baseline)
    out["state_bytes"] = state_bytes
    return out


def _first_save_results(sizes, folder: str) -> list:
    results = []
    for gib in sizes:
        f = _first_save_figures(gib, folder)
        size = f"{gib:g} GiB state"
        ratio = f["first_block"] / f["base"]
        peak = f["first_peak"] / f["state_bytes"]
        results.append(Result(AREA, f"first save() blocking, fresh checkpointer, vs torch.save + fsync ({size})",
                              100 * ratio, "%", "<= 50%", ratio <= 0.5,
                              f"{f['first_block']:.2f} s vs {f['base']:.2f} s (its pages are faulted in by the copy); "
                              f"second save {f['second_block']:.2f} s"))
        ratio = f["reserved_block"] / f["base"]
        results.append(Result(AREA, f"first save() blocking after reserve(state) vs torch.save + fsync ({size})",
                              100 * ratio, "%", "<= 50%", ratio <= 0.5,
                              f"{f['reserved_block']:.2f} s vs {f['base']:.2f} s"))
        results.append(Result(AREA, f"peak memory added by the first save, share of the state ({size})",
                              100 * peak, "%", None, None,
                              f"{f['first_peak'] / 2**30:.2f} GiB over {f['first_resident'] / 2**30:.2f} GiB resident "
                              f"(second save adds {f['second_peak'] / 2**30:.2f} GiB)"))
    return results


def run(quick: bool = False, first_save_gib=()) -> list:
    trainer = _Trainer(quick)
    state_bytes = _state_bytes(trainer.state())
    size = f"{state_bytes / 1e6:.0f} MB state"
    folder = tempfile.mkdtemp(prefix="qrnn-bench-ckpt-", dir=os.environ.get("QRNN_BENCH_DIR"))
    try:
        t = _save_figures(trainer, folder, rounds=2 if quick else 3)
        step_start = time.perf_counter()
        trainer.step()
        step_time = time.perf_counter() - step_start
        # An epoch long enough that one save is a small part of it, like a real epoch.
        steps = max(3, int((2.0 if quick else 12.0) / step_time))
        e = _epoch_figures(trainer, folder, steps=steps, pairs=3 if quick else 5)
        del trainer
        first = _first_save_results(first_save_gib, folder)
    finally:
        shutil.rmtree(folder, ignore_errors=True)

    base, base_total = t["torch_save"], t["torch_save"] + t["torch_fsync"]
    ms = lambda s: f"{s * 1e3:.0f} ms"  # noqa: E731
    results = []
    share = t["overlap_block"] / base
    results.append(Result(AREA, f"save() blocking, overlap mode, vs torch.save ({size})", 100 * share, "%",
                          "<= 5%", share <= 0.05,
                          f"{ms(t['overlap_block'])} (save() + wait in optimizer.step) vs torch.save {ms(base)}"))
    share = t["default_block"] / base
    results.append(Result(AREA, f"save() blocking, default mode, vs torch.save ({size})", 100 * share, "%",
                          "<= 25%", share <= 0.25, f"{ms(t['default_block'])} vs torch.save {ms(base)}"))
    ratio = t["default_total"] / base_total
    results.append(Result(AREA, f"total to committed file vs torch.save + fsync ({size})", ratio, "x",
                          "<= 1.2x", ratio <= 1.2,
                          f"{ms(t['default_total'])} vs {ms(base)} + fsync {ms(t['torch_fsync'])}"))
    ratio = t["overlap_total"] / base_total
    results.append(Result(AREA, f"total to committed file, overlap mode, vs torch.save + fsync ({size})", ratio,
                          "x", None, None, f"{ms(t['overlap_total'])}, includes the overlapped forward/backward"))
    share = t["async_block"] / base
    results.append(Result(AREA, f"async_save blocking time vs torch.save, same object ({size})", 100 * share, "%",
                          "<= 25%", share <= 0.25, f"{ms(t['async_block'])} vs torch.save {ms(base)}"))
    if t["lightning_block"] is not None:
        share = t["lightning_block"] / (2 * base)
        results.append(Result(AREA, f"Lightning QRNNCheckpointIO blocking, top-k + last saves, vs two torch.saves "
                              f"({size})", 100 * share, "%", "<= 25%", share <= 0.25,
                              f"{ms(t['lightning_block'])} vs 2 x torch.save {ms(base)}"))
    share = t["dcp_block"] / base
    results.append(Result(AREA, f"DCP async_save blocking vs torch.save ({size})", 100 * share, "%", None, None,
                          f"{ms(t['dcp_block'])}; DCP total {ms(t['dcp_total'])} = "
                          f"{t['dcp_total'] / base_total:.2f}x torch.save + fsync"))
    overhead = e["save"] / e["plain"] - 1
    spread = lambda k: f"{e[k + '_spread'][0]:.2f}-{e[k + '_spread'][1]:.2f} s"  # noqa: E731
    results.append(Result(AREA, f"epoch time with a save every epoch (overlap mode) vs without ({size})",
                          100 * overhead, "%", "<= +1%", overhead <= 0.01,
                          f"median {e['save']:.2f} s ({spread('save')}) vs {e['plain']:.2f} s ({spread('plain')}) "
                          f"per epoch of {steps} steps; process CPU {e['save_cpu']:.2f} vs {e['plain_cpu']:.2f} s"))
    return results + first
