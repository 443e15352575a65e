"""qrnn-train's settings have one definition (qrnn.train.settings.Settings): the parser's
flags, their defaults and help, and what resuming does with each all come from its fields."""

import dataclasses

import pytest

from qrnn.train.errors import TrainError
from qrnn.train.settings import FIXED, KEPT, Settings, build_parser, resolve


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
