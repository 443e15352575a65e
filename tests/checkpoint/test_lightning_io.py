"""qrnn.checkpoint.lightning.QRNNCheckpointIO under a real Lightning Trainer (skipped
without Lightning; its import rules: test_lightning_import.py)."""

import errno
import os

import pytest
import torch

from qrnn.checkpoint import CheckpointError
from qrnn.checkpoint._testing import faulty_async_save

pl = pytest.importorskip("lightning.pytorch")
from qrnn.checkpoint.lightning import QRNNCheckpointIO  # noqa: E402


class Tiny(pl.LightningModule):
    def __init__(self, width: int = 32):
        super().__init__()
        self.save_hyperparameters()
        self.layer = torch.nn.Linear(width, 1)

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = torch.nn.functional.mse_loss(self.layer(x), y)
        self.log("loss", loss)
        return loss

    def configure_optimizers(self):
        return torch.optim.Adam(self.parameters(), lr=0.01)


def loader(width=32, n=64):
    data = torch.utils.data.TensorDataset(torch.randn(n, width), torch.randn(n, 1))
    return torch.utils.data.DataLoader(data, batch_size=8)


def trainer(tmp_path, io, steps=12):
    checkpoints = pl.callbacks.ModelCheckpoint(dirpath=tmp_path / "ckpt", save_last=True, save_top_k=2,
                                               monitor="loss", every_n_train_steps=2)
    return pl.Trainer(max_steps=steps, plugins=[io], callbacks=[checkpoints], accelerator="cpu", devices=1,
                      logger=False, enable_progress_bar=False, enable_model_summary=False,
                      default_root_dir=tmp_path), checkpoints


def test_trainer_saves_loadable_checkpoints_and_removes_old_ones(tmp_path):
    io = QRNNCheckpointIO()
    fit, checkpoints = trainer(tmp_path, io)
    model = Tiny()
    fit.fit(model, loader())
    files = sorted(os.listdir(tmp_path / "ckpt"))
    assert [n for n in files if ".tmp-" in n] == []                 # no leftover temporaries
    assert "last.ckpt" in files and len(files) == 3                   # top 2 + last: removed ones are gone
    assert sorted(os.path.basename(p) for p in checkpoints.best_k_models) == sorted(set(files) - {"last.ckpt"})
    for name in files:
        loaded = Tiny.load_from_checkpoint(tmp_path / "ckpt" / name)
        assert loaded.hparams.width == 32
    last = Tiny.load_from_checkpoint(tmp_path / "ckpt" / "last.ckpt")
    assert torch.equal(last.layer.weight, model.layer.weight)         # the final step's weights
    state = torch.load(tmp_path / "ckpt" / "last.ckpt", weights_only=False)
    assert state["global_step"] == 12 and "optimizer_states" in state


def test_remove_waits_for_the_pending_save(tmp_path):
    io = QRNNCheckpointIO()
    path = tmp_path / "a.ckpt"
    for _ in range(3):
        io.save_checkpoint({"w": torch.randn(1 << 21)}, path)
        io.remove_checkpoint(path)   # a rename landing after this would bring the file back
        io.teardown()
        assert not path.exists() and os.listdir(tmp_path) == []
    io.save_checkpoint({"w": torch.arange(4)}, path)
    assert torch.equal(io.load_checkpoint(path)["w"], torch.arange(4))  # reads its own pending save
    io.teardown()


def test_storage_options_refused_like_lightnings_own(tmp_path):
    with pytest.raises(TypeError, match="storage_options"):
        QRNNCheckpointIO().save_checkpoint({"w": torch.ones(1)}, tmp_path / "a.ckpt", storage_options={})


def test_failure_surfaces_at_next_save_and_at_teardown(tmp_path):
    io = QRNNCheckpointIO()
    with faulty_async_save(after_bytes=0, errno=errno.ENOSPC, times=1):
        io.save_checkpoint({"w": torch.ones(10)}, tmp_path / "lost.ckpt")
        io._pending[str(tmp_path / "lost.ckpt")].wait()
        with pytest.raises(CheckpointError, match="lost.ckpt"):
            io.save_checkpoint({"w": torch.ones(10)}, tmp_path / "next.ckpt")
        io.teardown()  # reported once already; next.ckpt committed
        assert torch.equal(io.load_checkpoint(tmp_path / "next.ckpt")["w"], torch.ones(10))
    with faulty_async_save(after_bytes=0, errno=errno.ENOSPC):
        io.save_checkpoint({"w": torch.ones(10)}, tmp_path / "end.ckpt")
        with pytest.raises(CheckpointError, match="end.ckpt"):
            io.teardown()
    assert sorted(os.listdir(tmp_path)) == ["next.ckpt"]


def test_remote_paths_use_lightnings_own_writer():
    io = QRNNCheckpointIO()
    path = "memory://qrnn-test/remote.ckpt"  # fsspec's in-memory file system
    io.save_checkpoint({"w": torch.arange(3)}, path)
    assert torch.equal(io.load_checkpoint(path)["w"], torch.arange(3))
    io.remove_checkpoint(path)
    with pytest.raises(FileNotFoundError):
        io.load_checkpoint(path)
    io.teardown()
