"""awd-lstm-lm's AWD-QRNN recipe in qrnn-train: each regulariser against awd-lstm-lm's
definition (written out here from its model.py, embed_regularize.py, locked_dropout.py,
weight_drop.py and main.py), random BPTT lengths, the learning rate of each step, the
NT-ASGD trigger and switch, the presets' effective settings, and resuming bit-identically
across the switch with random lengths."""

import os

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn

import torchqrnn
from qrnn import QRNNLayer
from qrnn.train.cli import main as train_main
from qrnn.train.data import BPTTBatches, default_text
from qrnn.train.lm import QRNNLanguageModel, embedding_dropout, lm_loss, locked_dropout
from qrnn.train.optim import NTASGD, LearningRate, averaged_state_dict, averaged_weights, make_asgd
from qrnn.train.settings import PRESETS, Settings, build_parser, resolve

# ---- awd-lstm-lm's definitions -----------------------------------------------------------


def awd_embedded_dropout(embed, words, dropout):
    mask = embed.weight.new_empty((embed.weight.size(0), 1)).bernoulli_(1 - dropout).expand_as(embed.weight)
    return F.embedding(words, mask / (1 - dropout) * embed.weight)


def awd_lockdrop(x, dropout, training=True):
    if not training or not dropout:
        return x
    m = x.new_empty(1, x.size(1), x.size(2)).bernoulli_(1 - dropout)
    return x * (m / (1 - dropout))


class AWDWeightDrop(nn.Module):
    """DropConnect on the wrapped Linear's weight: F.dropout of the raw weight every call."""

    def __init__(self, module, dropout):
        super().__init__()
        self.module, self.dropout = module, dropout
        raw = module.weight
        del module._parameters["weight"]
        module.register_parameter("weight_raw", nn.Parameter(raw.data))

    def forward(self, x):
        w = F.dropout(self.module.weight_raw, p=self.dropout, training=self.training)
        return F.linear(x, w, self.module.bias)


class AWDModel(nn.Module):
    """model.py's RNNModel, QRNN branch, tied weights; forward returns (output, raw output)."""

    def __init__(self, ntoken, ninp, nhid, nlayers, dropout, dropouth, dropouti, dropoute, wdrop):
        super().__init__()
        self.encoder = nn.Embedding(ntoken, ninp)
        self.rnns = nn.ModuleList(
            torchqrnn.QRNNLayer(ninp if layer == 0 else nhid, nhid if layer != nlayers - 1 else ninp,
                                save_prev_x=True, window=2 if layer == 0 else 1)
            for layer in range(nlayers))
        for rnn in self.rnns:
            rnn.linear = AWDWeightDrop(rnn.linear, wdrop)
        self.decoder = nn.Linear(nhid, ntoken)
        self.decoder.weight = self.encoder.weight
        self.dropout, self.dropouth, self.dropouti, self.dropoute = dropout, dropouth, dropouti, dropoute

    def forward(self, tokens):
        emb = (awd_embedded_dropout(self.encoder, tokens, self.dropoute) if self.training and self.dropoute
               else self.encoder(tokens))
        raw = awd_lockdrop(emb, self.dropouti, self.training)
        for layer, rnn in enumerate(self.rnns):
            raw, _ = rnn(raw)
            if layer != len(self.rnns) - 1:
                raw = awd_lockdrop(raw, self.dropouth, self.training)
        return awd_lockdrop(raw, self.dropout, self.training), raw


def awd_switches(losses, nonmono):
    """main.py's trigger over a run's validation losses: the 1-based epoch of the switch."""
    best_val_loss = []
    for epoch, val_loss in enumerate(losses, 1):
        if len(best_val_loss) > nonmono and val_loss > min(best_val_loss[:-nonmono]):
            return epoch
        best_val_loss.append(val_loss)
    return None


# ---- each regulariser ---------------------------------------------------------------------


def test_embedding_dropout_is_awds_embedded_dropout():
    embed = nn.Embedding(50, 6)
    words = torch.randint(0, 50, (7, 3))
    torch.manual_seed(1)
    want = awd_embedded_dropout(embed, words, 0.3)
    want.square().sum().backward()
    grad, embed.weight.grad = embed.weight.grad, None
    torch.manual_seed(1)
    got = embedding_dropout(embed, words, 0.3, training=True)
    got.square().sum().backward()
    torch.testing.assert_close(got, want, rtol=0, atol=0)
    torch.testing.assert_close(embed.weight.grad, grad, rtol=1e-6, atol=1e-7)
    # Whole words: every occurrence of a word is kept or dropped together.
    dropped = got.abs().sum(-1) == 0
    for word in words.unique():
        assert dropped[words == word].all() or not dropped[words == word].any()
    assert torch.equal(embedding_dropout(embed, words, 0.3, training=False), embed(words))


def test_locked_dropout_is_awds():
    x = torch.randn(9, 4, 5)
    torch.manual_seed(2)
    want = awd_lockdrop(x, 0.4)
    torch.manual_seed(2)
    got = locked_dropout(x, 0.4, training=True)
    assert torch.equal(got, want)
    assert torch.equal((got == 0)[0], (got == 0)[-1])  # one mask for every step
    assert locked_dropout(x, 0.4, training=False) is x


def test_weight_drop_is_awds_weight_drop_without_a_wrapper():
    torch.manual_seed(3)
    layer = QRNNLayer(5, 7, window=2, weight_drop=0.3)
    awd = QRNNLayer(5, 7, window=2)
    awd.load_state_dict(layer.state_dict())
    awd.linear = AWDWeightDrop(awd.linear, 0.3)
    assert list(layer.state_dict()) == ["linear.weight", "linear.bias"]  # pytorch-qrnn's keys, unchanged
    x = torch.randn(6, 2, 5)
    torch.manual_seed(4)
    want, _ = awd(x)
    want.sum().backward()
    torch.manual_seed(4)
    got, _ = layer(x)
    got.sum().backward()
    torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(layer.linear.weight.grad, awd.linear.module.weight_raw.grad, rtol=1e-5, atol=1e-6)
    assert not torch.equal(got, layer.eval()(x)[0])  # training drops; evaluation does not
    awd.eval()
    torch.testing.assert_close(layer(x)[0], awd(x)[0], rtol=1e-6, atol=1e-6)


def test_weight_drop_refuses_a_replaced_linear():
    layer = QRNNLayer(3, 4, weight_drop=0.2)
    layer.linear = AWDWeightDrop(layer.linear, 0.2)
    with pytest.raises(ValueError, match="weight_drop=0.2 needs layer.linear to be a plain nn.Linear"):
        layer(torch.randn(2, 1, 3))
    hooked = QRNNLayer(3, 4, weight_drop=0.2)
    hooked.linear.register_forward_hook(lambda module, args, out: None)
    with pytest.raises(ValueError, match="without hooks"):  # never a hook silently skipped
        hooked(torch.randn(2, 1, 3))
    with pytest.raises(ValueError, match="weight_drop"):
        QRNNLayer(3, 4, weight_drop=1.0)


def test_the_whole_model_draws_and_computes_as_awds():
    """Every regulariser on at once: the same random draws in the same order, the same outputs."""
    rates = dict(dropout=0.4, dropouth=0.3, dropouti=0.5, dropoute=0.1, wdrop=0.2)
    torch.manual_seed(5)
    ours = QRNNLanguageModel(40, emsize=6, hidden=10, layers=3, dropout=rates["dropout"],
                             dropout_emb=rates["dropouti"], dropout_hidden=rates["dropouth"],
                             dropout_words=rates["dropoute"], weight_drop=rates["wdrop"])
    awd = AWDModel(40, 6, 10, 3, **rates)
    with torch.no_grad():
        awd.encoder.weight.copy_(ours.embedding.weight)
        awd.decoder.bias.copy_(ours.decoder.bias)
        for mine, theirs in zip(ours.layers, awd.rnns):
            theirs.linear.module.weight_raw.copy_(mine.layers[0].linear.weight)
            theirs.linear.module.bias.copy_(mine.layers[0].linear.bias)
    tokens = torch.randint(0, 40, (8, 3))
    torch.manual_seed(6)
    output, raw = awd(tokens)
    torch.manual_seed(6)
    features, _ = ours(tokens)
    torch.testing.assert_close(features.output, output, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(features.raw, raw, rtol=1e-5, atol=1e-6)


def test_activation_regularisation_terms_are_awds():
    torch.manual_seed(7)
    model = QRNNLanguageModel(30, emsize=4, hidden=8, layers=2, dropout=0.3)
    tokens, targets = torch.randint(0, 30, (9, 2)), torch.randint(0, 30, (9, 2))
    features, _ = model(tokens)
    objective, cross_entropy = lm_loss(model, features, targets, alpha=2.0, beta=1.0)
    logits = model.decoder(features.output)
    raw_loss = F.cross_entropy(logits.view(-1, 30), targets.view(-1))
    ar = 2.0 * features.output.pow(2).mean()
    tar = 1.0 * (features.raw[1:] - features.raw[:-1]).pow(2).mean()
    torch.testing.assert_close(cross_entropy, raw_loss)
    torch.testing.assert_close(objective, raw_loss + ar + tar)
    model.eval()
    features, _ = model(tokens)
    objective, cross_entropy = lm_loss(model, features, targets, alpha=2.0, beta=1.0)
    assert torch.equal(objective, cross_entropy)  # evaluation: the cross-entropy alone


# ---- lengths, learning rates, the trigger ---------------------------------------------------


def test_random_bptt_lengths_follow_awds_rule_and_the_epoch():
    ids = torch.arange(20 * 3000)
    batches = BPTTBatches(ids, 20, 70, random_lengths=9001)
    lengths = [batches[i][0].shape[0] for i in range(len(batches) - 1)]
    assert min(lengths) >= 5 and abs(sum(lengths) / len(lengths) - 70 * 0.975) < 2.0
    assert sum(1 for n in lengths if n < 50) > 0  # the half-length draws
    # Every target exactly once, each chunk continuing the last.
    targets = torch.cat([batches[i][1] for i in range(len(batches))])
    assert torch.equal(targets, batches.stream[1:])
    first = [int(s) for s in batches._starts]
    batches.set_epoch(1)
    assert [int(s) for s in batches._starts] != first
    batches.set_epoch(0)
    assert [int(s) for s in batches._starts] == first
    # The same lengths on every rank of two.
    ranks = [BPTTBatches(ids, 20, 70, rank, 2, random_lengths=9001) for rank in range(2)]
    assert [int(s) for s in ranks[0]._starts] == [int(s) for s in ranks[1]._starts] == first


def test_learning_rate_of_each_step():
    rate = LearningRate(30.0, warmup=0, when=(3, 5), bptt=70, scale_by_length=True)
    assert rate(0, 0, 70) == 30.0
    assert rate(0, 0, 35) == 15.0  # awd-lstm-lm: lr * seq_len / bptt
    assert rate(9, 3, 70) == pytest.approx(3.0)  # after epoch 3's end
    assert rate(9, 5, 70) == pytest.approx(0.3)
    # After an averaged-SGD switch at epoch 4, main.py restarts from --lr (and only a drop at
    # the switch epoch itself applies).
    assert rate(9, 5, 70, switched_at=4) == 30.0
    assert rate(9, 5, 70, switched_at=5) == pytest.approx(3.0)
    warm = LearningRate(1.0, warmup=4)
    assert [warm(step, 0, 7) for step in range(5)] == [0.25, 0.5, 0.75, 1.0, 1.0]


@settings(max_examples=200, deadline=None)
@given(st.lists(st.floats(1.0, 10.0), min_size=1, max_size=30), st.integers(1, 6))
def test_nt_asgd_trigger_is_awds(losses, nonmono):
    trigger = NTASGD(nonmono)
    switched = None
    for epoch, loss in enumerate(losses, 1):
        if trigger.should_switch(loss):
            switched = trigger.switched_at = epoch
    assert switched == awd_switches(losses, nonmono)


def test_evaluation_and_samples_use_the_averaged_weights():
    torch.manual_seed(8)
    model = nn.Linear(3, 2)
    optimizer = make_asgd(model.parameters(), lr=0.1, weight_decay=0.0)
    for _ in range(4):
        optimizer.zero_grad()
        model(torch.randn(5, 3)).square().sum().backward()
        optimizer.step()
    current = model.weight.detach().clone()
    with averaged_weights(optimizer) as averaged:
        assert averaged and torch.equal(model.weight, optimizer.state[model.weight]["ax"])
    assert torch.equal(model.weight, current)
    state = averaged_state_dict(model, optimizer.state_dict())
    assert state is not None and torch.equal(state["weight"], optimizer.state[model.weight]["ax"])
    assert averaged_state_dict(model, torch.optim.SGD(model.parameters(), lr=1.0).state_dict()) is None


# ---- presets ----------------------------------------------------------------------------------

# awd-lstm-lm's README commands over main.py's defaults, in main.py's flag names.
AWD_MAIN_DEFAULTS = dict(emsize=400, nhid=1150, nlayers=3, lr=30.0, clip=0.25, batch_size=80, bptt=70, dropout=0.4,
                         dropouth=0.3, dropouti=0.65, dropoute=0.1, wdrop=0.5, seed=1111, nonmono=5, alpha=2.0,
                         beta=1.0, wdecay=1.2e-6, optimizer="sgd", when=())
AWD_COMMANDS = {
    "awd-qrnn-ptb": dict(batch_size=20, clip=0.2, wdrop=0.1, nhid=1550, nlayers=4, emsize=400, dropouth=0.3,
                         seed=9001, dropouti=0.4, epochs=550),
    "awd-qrnn-wt2": dict(epochs=500, clip=0.25, dropouti=0.4, dropouth=0.2, nhid=1550, nlayers=4, seed=4002,
                         wdrop=0.1, batch_size=40),
    "awd-qrnn-wt103": dict(epochs=14, nlayers=4, emsize=400, nhid=2500, alpha=0.0, beta=0.0, dropoute=0.0,
                           dropouth=0.1, dropouti=0.1, dropout=0.1, wdrop=0.0, wdecay=0.0, bptt=140, batch_size=60,
                           optimizer="adam", lr=1e-3, when=(12,)),
}
OURS = dict(nhid="hidden", nlayers="layers")


@pytest.mark.parametrize("preset", sorted(PRESETS))
def test_presets_are_awds_commands(preset, capsys):
    resolved = resolve(build_parser(preset).parse_args(["--preset", preset]), None)
    want = dict(AWD_MAIN_DEFAULTS, **AWD_COMMANDS[preset])
    for name, value in want.items():
        ours = getattr(resolved, OURS.get(name, name))
        if name == "optimizer":
            assert ours == ("asgd" if value == "sgd" else value)  # main.py's sgd is NT-ASGD
        else:
            assert ours == value, name
    assert (resolved.level, resolved.window, resolved.bptt_lengths, resolved.warmup, resolved.eval_batch_size) == \
        ("word", 2, "random", 0, 10)
    assert resolved.precision == "auto"
    # A flag given wins over the preset; --help shows the preset's values.
    assert resolve(build_parser(preset).parse_args(["--preset", preset, "--lr", "2"]), None).lr == 2.0
    with pytest.raises(SystemExit):
        build_parser(preset).parse_args(["--help"])
    assert f"(default: {want['nhid']})" in capsys.readouterr().out


def test_preset_keys_are_saved_settings():
    saved = {name for name in Settings().saved()}
    for preset in PRESETS.values():
        assert set(preset) <= saved


def test_a_checkpoint_wins_over_the_preset():
    checkpoint = {"settings": dict(Settings().saved(), preset="awd-qrnn-ptb", lr=2.0, hidden=64)}
    resolved = resolve(build_parser().parse_args([]), checkpoint)
    assert (resolved.lr, resolved.hidden, resolved.preset) == (2.0, 64, "awd-qrnn-ptb")


def test_dropout_zero_still_turns_every_dropout_off():
    resolved = resolve(build_parser().parse_args(["--dropout", "0"]), None)
    assert (resolved.dropout, resolved.dropouth, resolved.dropouti, resolved.dropoute, resolved.wdrop) == (0,) * 5


# ---- end to end: the switch, resume bit-identical with random lengths --------------------------


def _small_recipe(tmp_path):
    data = tmp_path / "text.txt"
    data.write_text(default_text()[:30_000], encoding="utf-8")
    return ["--data", str(data), "--preset", "awd-qrnn-ptb", "--layers", "2", "--hidden", "24", "--emsize", "12",
            "--batch-size", "8", "--eval-batch-size", "4", "--bptt", "12", "--precision", "fp32", "--no-progress",
            "--sample-length", "5", "--epochs", "3", "--lr", "2"]


def _checkpoints(folder):
    return sorted(name for name in os.listdir(folder) if name.startswith("step-") or name.startswith("ckpt"))


def test_switch_to_averaged_sgd_and_resume_bit_identical(tmp_path, monkeypatch, capsys):
    """The switch forced after epoch 1; one run straight through, one stopped mid-epoch 3 and
    resumed: the same weights and the same averages, bit for bit."""
    def switch_after_first(self, valid_loss):
        self.losses.append(valid_loss)
        return len(self.losses) == 1

    monkeypatch.setattr(NTASGD, "should_switch", switch_after_first)
    args = _small_recipe(tmp_path)
    straight, resumed = tmp_path / "straight", tmp_path / "resumed"
    assert train_main(args + ["--checkpoint-dir", str(straight)]) == 0
    out = capsys.readouterr().out
    assert "recipe: awd-qrnn-ptb; asgd (nonmono 5) lr 2" in out
    assert "epoch 1: validation stopped improving (--nonmono 5): switching to averaged SGD" in out
    from qrnn.train.checkpoints import load_checkpoint
    from qrnn.train.runs import latest_checkpoint
    final = load_checkpoint(latest_checkpoint(str(straight)))
    steps = final["progress"]["step"]
    assert final["nt_asgd"]["switched_at"] == 1
    assert all("ax" in s for s in final["optimizer"]["state"].values())
    assert train_main(args + ["--checkpoint-dir", str(resumed), "--max-steps", str(steps - 3)]) == 0
    assert train_main(args + ["--checkpoint-dir", str(resumed), "--resume"]) == 0
    out = capsys.readouterr().out
    assert "asgd (averaging since epoch 1) lr 2" in out
    again = load_checkpoint(latest_checkpoint(str(resumed)))
    assert again["progress"]["step"] == steps
    for key, value in final["model"].items():
        assert torch.equal(again["model"][key], value), key
    for index, state in final["optimizer"]["state"].items():
        assert torch.equal(again["optimizer"]["state"][index]["ax"], state["ax"])
    assert [r["valid_loss"] for r in again["history"] if r["complete"]] == \
        [r["valid_loss"] for r in final["history"]]


def test_bf16_requested_on_a_cpu_that_emulates_it_says_so(monkeypatch):
    from qrnn.train import precision

    monkeypatch.setattr(precision, "cpu_bf16_support", lambda: (False, "CPU has neither avx512_bf16 nor amx_bf16"))
    chosen, reason = precision.choose_precision("bf16", torch.device("cpu"))
    assert chosen == "bf16" and "emulates bfloat16 matrix products" in reason and "auto picks fp32" in reason
    assert precision.choose_precision("auto", torch.device("cpu"))[0] == "fp32"
    monkeypatch.setattr(precision, "cpu_bf16_support", lambda: (True, "CPU has amx_bf16"))
    assert precision.choose_precision("bf16", torch.device("cpu")) == ("bf16", "requested")
    assert precision.choose_precision("auto", torch.device("cpu"))[0] == "bf16"


@pytest.mark.parametrize("damage", [{"losses": "x", "switched_at": None}, {"losses": [1.0], "switched_at": -3},
                                    {"switched_at": None}])
def test_a_damaged_averaged_sgd_state_is_one_line(tmp_path, capsys, damage):
    args = _small_recipe(tmp_path) + ["--epochs", "1", "--max-steps", "2", "--checkpoint-dir", str(tmp_path / "run")]
    assert train_main(args) == 0
    from qrnn.checkpoint import load
    from qrnn.train.runs import latest_checkpoint
    path = latest_checkpoint(str(tmp_path / "run"))
    state = load(path)
    state["nt_asgd"] = damage
    torch.save(state, path)
    capsys.readouterr()
    assert train_main(args[:-6] + ["--max-steps", "3", "--checkpoint-dir", str(tmp_path / "run"), "--resume"]) == 2
    err = capsys.readouterr().err
    assert "its averaged-SGD state is damaged" in err and err.count("\n") == 1
