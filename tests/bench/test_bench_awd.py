"""The awd benchmark area's driver of awd-lstm-lm's main.py, run against a stand-in checkout
(a main.py with the same module and class names, written here), and its weight copy into
qrnn-train's model. The real comparison needs a checkout of salesforce/awd-lstm-lm
(``AWD_LSTM_LM=<checkout> python -m qrnn.bench awd``)."""

import textwrap

import numpy as np
import torch

from qrnn.bench import awd

STAND_IN = {
    "data.py": """
        class Dictionary:
            def __init__(self):
                self.idx2word = []

        class Corpus:
            def __init__(self, path):
                self.dictionary = Dictionary()
                for name in ("train.txt", "valid.txt", "test.txt"):
                    for word in open(path + "/" + name).read().split() + ["<eos>"]:
                        if word not in self.dictionary.idx2word:
                            self.dictionary.idx2word.append(word)
    """,
    "model.py": """
        import torch

        class RNNModel(torch.nn.Module):
            def __init__(self, ntoken, emsize):
                super().__init__()
                self.encoder = torch.nn.Embedding(ntoken, emsize)
    """,
    "splitcross.py": """
        import torch

        class SplitCrossEntropyLoss(torch.nn.Module):
            def forward(self, weight, bias, hiddens, targets):
                return (weight.sum() * 0 + hiddens).mean()
    """,
    "main.py": """
        import argparse, sys
        import numpy as np
        import torch
        import data, model, splitcross
        parser = argparse.ArgumentParser()
        parser.add_argument("--data")
        parser.add_argument("--bptt", type=int)
        args, _ = parser.parse_known_args()
        corpus = data.Corpus(args.data)
        m = model.RNNModel(len(corpus.dictionary.idx2word), 4)
        criterion = splitcross.SplitCrossEntropyLoss()
        print("length", np.random.normal(args.bptt, 5), np.random.random())
        for step in range(50):
            m.train()
            criterion(m.encoder.weight, None, torch.full((2,), float(step)), None)
    """,
}


def test_the_driver_runs_main_py_unedited_and_records_losses(tmp_path):
    checkout = tmp_path / "awd-lstm-lm"
    checkout.mkdir()
    for name, code in STAND_IN.items():
        (checkout / name).write_text(textwrap.dedent(code))
    data = awd.write_corpus(tmp_path / "corpus", dict(train=2_000, valid=200, test=200, vocab=50))
    flags = awd._flags("awd-qrnn-ptb", quick=True)
    record = awd.awd_run(str(checkout), data, flags, steps=7, fixed_length=True)
    assert record["losses"] == [float(step) for step in range(7)]
    assert len(record["times"]) == 8  # each step's loss call, and the one it stopped at
    assert set(record["initial"]) == {"encoder.weight"}
    assert "<unk>" in record["words"] and "<eos>" in record["words"]


def test_awd_weights_land_in_the_right_rows(tmp_path):
    data = awd.write_corpus(tmp_path / "corpus", dict(train=3_000, valid=300, test=300, vocab=40))
    run = awd.qrnn_run(data, "awd-qrnn-ptb", "fp32", quick=True)
    vocab = run.corpus.vocab
    words = list(reversed(vocab.tokens))  # awd-lstm-lm numbers words by first appearance
    model = run.model
    initial = {"encoder.weight": torch.randn(len(words), model.embedding.weight.shape[1]),
               "decoder.bias": torch.randn(len(words))}
    for i, layer in enumerate(model.layers):
        linear = layer.layers[0].linear
        initial[f"rnns.{i}.linear.module.weight_raw"] = torch.randn_like(linear.weight)
        initial[f"rnns.{i}.linear.module.bias"] = torch.randn_like(linear.bias)
    awd.load_awd_weights(run.trainer, {"initial": initial, "words": words}, vocab)
    for theirs, word in enumerate(words):
        ours = vocab.tokens.index(word)
        assert torch.equal(model.embedding.weight[ours], initial["encoder.weight"][theirs])
        assert torch.equal(model.decoder.bias[ours], initial["decoder.bias"][theirs])
    assert torch.equal(model.layers[1].layers[0].linear.weight, initial["rnns.1.linear.module.weight_raw"])
    assert np.isnan(awd._bf16_skipped("figure", "<= 0.4x").value)
