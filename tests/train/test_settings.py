"""qrnn-train's settings have one definition (qrnn.train.settings.Settings): the parser's
flags, their defaults and help, and what resuming does with each all come from its fields."""

import dataclasses

import pytest

from qrnn.train.errors import TrainError
from qrnn.train.settings import FIXED, KEPT, PRESET_LRS, PRESETS, Settings, build_parser, preset_of, resolve


def test_one_flag_per_field_with_its_default_and_help():
    parser = build_parser()
    flags = {action.dest: action for action in parser._actions if action.dest != "help"}
    fields = {f.name: f for f in dataclasses.fields(Settings)}
    assert set(flags) == set(fields)
    text = parser.format_help()
    for name, f in fields.items():
        assert "--" + name.replace("_", "-") in text
        assert f.metadata["help"].split()[0] in text, name
        # A saved setting's flag defaults to None (so a given value is told from the default).
        assert flags[name].default == (None if f.metadata["resume"] else f.default), name
    assert "(default: 1234)" in text and "(default: None)" not in text
    assert vars(parser.parse_args([])).keys() == fields.keys()
    assert resolve(parser.parse_args([]), None) == Settings()


def test_resume_keeps_or_fixes_what_the_checkpoint_recorded():
    parser = build_parser()
    saved = dict(Settings(hidden=64, epochs=2, precision="fp32").saved())
    checkpoint = {"settings": saved}
    assert set(saved) == {f.name for f in dataclasses.fields(Settings) if f.metadata["resume"] in (FIXED, KEPT)}
    settings = resolve(parser.parse_args(["--epochs", "5", "--keep-last", "1"]), checkpoint)
    assert (settings.hidden, settings.epochs, settings.precision, settings.keep_last) == (64, 5, "fp32", 1)
    assert resolve(parser.parse_args(["--hidden", "64"]), checkpoint).hidden == 64  # the same value: fine
    with pytest.raises(TrainError, match="--hidden 32 conflicts with the checkpoint, trained with --hidden 64"):
        resolve(parser.parse_args(["--hidden", "32"]), checkpoint)
    with pytest.raises(TrainError, match="--batch-size 8 conflicts"):
        resolve(parser.parse_args(["--batch-size", "8"]), checkpoint)


def test_a_presets_lr_belongs_to_its_optimizer():
    """--preset awd-qrnn-ptb trains SGD at lr 30: with --optimizer adam and no --lr it takes
    awd-lstm-lm's Adam lr, and the recipe line says where that lr comes from; a given --lr wins."""
    from qrnn.train.optim import NTASGD
    from qrnn.train.report import recipe_line

    def settings(*argv):
        return resolve(build_parser(preset_of(list(argv))).parse_args(list(argv)), None)

    for name, preset in PRESETS.items():  # each preset's own lr is its optimizer's
        assert PRESET_LRS[name][preset["optimizer"]] == preset["lr"], name
    ptb = settings("--preset", "awd-qrnn-ptb")
    assert (ptb.optimizer, ptb.lr) == ("asgd", 30.0)
    assert " (the preset's lr" not in recipe_line(ptb, NTASGD(5))
    adam = settings("--preset", "awd-qrnn-ptb", "--optimizer", "adam")
    assert (adam.optimizer, adam.lr) == ("adam", 1e-3)
    assert "; adam lr 0.001 (the preset's lr for adam; its 30 is asgd's: --lr sets another)," in recipe_line(
        adam, NTASGD(5))
    assert settings("--preset", "awd-qrnn-ptb", "--optimizer", "adam", "--lr", "0.02").lr == 0.02
    assert settings("--preset", "awd-qrnn-ptb", "--optimizer", "sgd").lr == 30.0
    wt103 = settings("--preset", "awd-qrnn-wt103", "--optimizer", "asgd")
    assert wt103.lr == 30.0 and "asgd (nonmono 5) lr 30 (the preset's lr for asgd; its 0.001 is adam's" in (
        recipe_line(wt103, NTASGD(5)))
    # Without a preset the default lr is Adam's: another optimizer without --lr says so.
    sgd = settings("--optimizer", "sgd")
    assert sgd.lr == 0.005 and "sgd lr 0.005 (the default lr, adam's: --lr sets another)" in recipe_line(
        sgd, NTASGD(5))
    assert "(the default" not in recipe_line(settings("--optimizer", "sgd", "--lr", "0.1"), NTASGD(5))


@pytest.mark.parametrize("vocab, cutoffs, accepted, refused", [
    (73, None, ("full", "auto"), "adaptive"),
    (100_000, [2800, 20000, 76000], ("adaptive", "auto"), "full"),
])
def test_resume_compares_the_softmax_auto_chose(vocab, cutoffs, accepted, refused):
    """A run started with --softmax auto resumes with the softmax auto chose given explicitly;
    the other one is refused, naming what auto chose."""
    parser = build_parser()
    checkpoint = {"settings": Settings().saved(), "model_config": {"vocab_size": vocab, "cutoffs": cutoffs}}
    assert checkpoint["settings"]["softmax"] == "auto"
    for softmax in accepted:
        assert resolve(parser.parse_args(["--softmax", softmax]), checkpoint).softmax in ("auto", softmax)
    chose = "full" if cutoffs is None else "adaptive"
    with pytest.raises(TrainError, match=rf"^--softmax {refused} conflicts with the checkpoint, trained with "
                                         rf"--softmax auto \(which chose {chose}\)"):
        resolve(parser.parse_args(["--softmax", refused]), checkpoint)
    # And the other way round: a run given an explicit softmax resumes with auto choosing the same.
    explicit = {"settings": Settings(softmax=chose).saved(), "model_config": checkpoint["model_config"]}
    assert resolve(parser.parse_args(["--softmax", "auto"]), explicit).softmax in ("auto", chose)


def test_settings_compose_the_components_configs_in_the_flags_units():
    """Each component's config takes its flags' values as they are: no unit is converted
    between the command line and the Trainer (--save-interval is minutes in both)."""
    from qrnn.train import CheckpointConfig, PrecisionConfig, StopConfig

    settings = Settings(save_interval=2.5, save_every=7, keep_last=4, checkpoint_format="dcp", checkpoint_dir="d",
                        precision="bf16", clip=0.5, stop_grace=12.0, window=3, dropout=0.2, dropouti=0.3,
                        wdrop=0.1, wdecay=1e-4, optimizer="asgd", when=(3,), batch_size=8, bptt=10)
    assert settings.checkpoint_config == CheckpointConfig("d", keep_last=4, save_every=7, save_interval=2.5,
                                                          format="dcp")
    assert settings.checkpoint_config.interval_seconds == 150.0
    assert settings.precision_config == PrecisionConfig("bf16", clip_norm=0.5)
    assert settings.stop_config == StopConfig(grace=12.0)
    assert settings.model_config.arguments(50, None) == dict(
        vocab_size=50, emsize=128, hidden=256, layers=3, dropout=0.2, dropout_emb=0.3, first_window=3,
        dropout_hidden=0.2, dropout_words=0.0, weight_drop=0.1, cutoffs=None)
    assert (settings.model_config.alpha, settings.model_config.softmax) == (0.0, "auto")
    optim = settings.optimizer_config
    assert (optim.name, optim.lr, optim.weight_decay, optim.warmup, optim.when, optim.nonmono) == (
        "asgd", 5e-3, 1e-4, 100, (3,), 5)
    data = settings.data_config
    assert (data.path, data.level, data.batch_size, data.eval_batch_size, data.bptt, data.bptt_lengths) == (
        None, "char", 8, None, 10, "fixed")
