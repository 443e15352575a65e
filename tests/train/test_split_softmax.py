"""The split (adaptive) softmax of large vocabularies: a proper distribution over every word,
the loss its negative log-likelihood, gradients (gradcheck in float64), no tokens x
vocabulary tensor in training or evaluation, sampling cluster by cluster from the right
distribution at any temperature, and qrnn-train / qrnn-generate / --resume with it."""

import types

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from qrnn.train.cli import main as train_main
from qrnn.train.data import default_text
from qrnn.train.errors import TrainError
from qrnn.train.generate import generate_main
from qrnn.train.lm import QRNNLanguageModel, generate, lm_loss
from qrnn.train.setup import _softmax_cutoffs
from qrnn.train.softmax import SplitSoftmax, default_cutoffs

F64 = torch.float64


def _split(vocab=50, features=6, cutoffs=(10, 25, 40), dtype=F64):
    torch.manual_seed(11)
    split = SplitSoftmax(features, vocab, cutoffs).to(dtype)
    with torch.no_grad():
        split.tail_vectors.normal_()
        split.tail_bias.normal_()
    weight = torch.randn(vocab, features, dtype=dtype)
    bias = torch.randn(vocab, dtype=dtype)
    return split, weight, bias


def test_a_proper_distribution_and_its_nll():
    split, weight, bias = _split()
    hidden = torch.randn(30, 6, dtype=F64)
    log_probs = split.log_probs(weight, bias, hidden)
    assert log_probs.shape == (30, 50)
    torch.testing.assert_close(log_probs.logsumexp(1), torch.zeros(30, dtype=F64))
    targets = torch.cat([torch.arange(50), torch.randint(0, 50, (10,))])[torch.randperm(60)][:30]
    nll = split.nll(weight, bias, hidden, targets)
    want = -log_probs.gather(1, targets.unsqueeze(1)).squeeze(1)
    torch.testing.assert_close(nll.sum(), want.sum())
    torch.testing.assert_close(nll.sort().values, want.sort().values)


def test_gradients_gradcheck():
    split, weight, bias = _split(vocab=12, features=3, cutoffs=(4, 8))
    hidden = torch.randn(7, 3, dtype=F64, requires_grad=True)
    weight.requires_grad_()
    bias.requires_grad_()
    targets = torch.tensor([0, 3, 4, 7, 8, 11, 5])

    class Loss(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.split = split

        def forward(self, h, w, b):
            return self.split.nll(w, b, h, targets).sum()

    module = Loss()

    def loss(h, w, b, tv, tb):  # the module's parameters as inputs
        return torch.func.functional_call(module, {"split.tail_vectors": tv, "split.tail_bias": tb}, (h, w, b))

    tv = split.tail_vectors.detach().clone().requires_grad_()
    tb = split.tail_bias.detach().clone().requires_grad_()
    assert torch.autograd.gradcheck(lambda h, w, b: split.nll(w, b, h, targets).sum(), (hidden, weight, bias))
    assert torch.autograd.gradcheck(loss, (hidden, weight, bias, tv, tb))


class _LargestTensor(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.largest = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in out if isinstance(out, (tuple, list)) else (out,):
            if isinstance(t, torch.Tensor):
                self.largest = max(self.largest, t.numel())
        return out


def test_no_tokens_by_vocabulary_tensor_in_training_or_evaluation():
    torch.manual_seed(12)
    vocab, tokens = 4000, (20, 6)
    model = QRNNLanguageModel(vocab, emsize=8, hidden=16, layers=2, cutoffs=(100, 1000))
    # Zipf-like targets: mostly head words, some in each cluster.
    targets = torch.cat([torch.randint(0, 100, (100,)), torch.randint(100, 1000, (15,)),
                         torch.randint(1000, vocab, (5,))])[torch.randperm(120)].view(tokens)
    inputs = torch.randint(0, vocab, tokens)
    for training in (True, False):
        model.train(training)
        with _LargestTensor() as mode:
            features, _ = model(inputs)
            objective, _ = lm_loss(model, features, targets, alpha=2.0, beta=1.0)
            if training:
                objective.backward()
        n = tokens[0] * tokens[1]
        assert mode.largest < n * vocab / 4, (training, mode.largest)  # the full logits: n * vocab
        assert mode.largest <= max(vocab * 8, n * 1000)  # the embedding's gradient, a cluster's logits


@pytest.mark.parametrize("temperature", [1.0, 0.5])
def test_sampling_cluster_by_cluster_draws_from_the_tempered_distribution(temperature):
    split, weight, bias = _split(vocab=12, features=3, cutoffs=(4, 8), dtype=torch.float32)
    hidden = torch.randn(3)
    want = torch.softmax(split.log_probs(weight, bias, hidden.view(1, -1))[0] / temperature, 0)
    generator = torch.Generator().manual_seed(13)
    draws = 20_000
    counts = torch.zeros(12)
    for _ in range(draws):
        counts[split.sample(weight, bias, hidden, temperature, generator)] += 1
    torch.testing.assert_close(counts / draws, want, atol=0.012, rtol=0)


def test_generate_with_the_split_softmax():
    torch.manual_seed(14)
    model = QRNNLanguageModel(300, emsize=8, hidden=16, layers=2, cutoffs=(20, 100))
    out = generate(model, torch.tensor([1, 2, 3]), 25, 0.8, torch.Generator().manual_seed(1))
    assert out.shape == (25,) and 0 <= int(out.min()) and int(out.max()) < 300
    again = generate(model, torch.tensor([1, 2, 3]), 25, 0.8, torch.Generator().manual_seed(1))
    assert torch.equal(out, again)


def test_softmax_choice():
    def settings(softmax="auto", cutoffs=()):
        return types.SimpleNamespace(softmax=softmax, cutoffs=cutoffs)

    assert _softmax_cutoffs(settings(), 75_000) is None
    assert _softmax_cutoffs(settings(), 267_735) == (2800, 20000, 76000)  # awd-lstm-lm's rule
    assert _softmax_cutoffs(settings(), 600_000) == (4200, 35000, 180000)
    assert _softmax_cutoffs(settings("adaptive"), 1000) == default_cutoffs(1000) == (50, 250)
    assert _softmax_cutoffs(settings("adaptive", (10, 20)), 1000) == (10, 20)
    with pytest.raises(TrainError, match="--cutoffs needs --softmax adaptive"):
        _softmax_cutoffs(settings("full", (10,)), 1000)
    with pytest.raises(TrainError, match="--cutoffs: cutoffs must be increasing"):
        _softmax_cutoffs(settings("adaptive", (20, 10)), 1000)
    with pytest.raises(TrainError, match="in \\[1, 1000\\)"):
        _softmax_cutoffs(settings("adaptive", (10, 1000)), 1000)


def test_train_resume_and_generate_with_the_adaptive_softmax(tmp_path, capsys):
    data = tmp_path / "text.txt"
    data.write_text(default_text()[:60_000], encoding="utf-8")
    run = tmp_path / "run"
    args = ["--data", str(data), "--level", "word", "--softmax", "adaptive", "--layers", "2", "--hidden", "16",
            "--emsize", "8", "--batch-size", "4", "--bptt", "8", "--precision", "fp32", "--no-progress",
            "--sample-length", "5", "--checkpoint-dir", str(run), "--epochs", "1"]
    assert train_main(args + ["--max-steps", "4"]) == 0
    out = capsys.readouterr().out
    assert "softmax adaptive, cutoffs " in out
    assert train_main(args + ["--max-steps", "8", "--resume"]) == 0
    assert "softmax adaptive, cutoffs " in capsys.readouterr().out
    assert generate_main(["--checkpoint", str(run), "--length", "12", "--prompt", "the"]) == 0
    assert len(capsys.readouterr().out.split()) >= 12
    code = train_main(args + ["--resume", "--softmax", "full"])
    assert code == 2
    assert "--softmax full conflicts with the checkpoint" in capsys.readouterr().err


@pytest.mark.parametrize("bad", [50, 1000, -1])
def test_targets_outside_the_vocabulary_are_refused(bad, monkeypatch):
    # Before, an id >= the vocabulary fell in no cluster and was left out of the loss.
    split, weight, bias = _split()
    hidden = torch.randn(6, 6, dtype=F64)
    targets = torch.tensor([0, 3, 49, 12, bad, 7])
    with pytest.raises(ValueError, match=r"targets must be word ids in \[0, 50\).*" + str(bad)):
        split.nll(weight, bias, hidden, targets)
    # The device-side check (a GPU's, or a compiled graph's) refuses them too.
    monkeypatch.setattr(torch.compiler, "is_compiling", lambda: True)
    with pytest.raises(RuntimeError):
        split.nll(weight, bias, hidden, targets)
    split.nll(weight, bias, hidden, targets.clamp(0, 49))
