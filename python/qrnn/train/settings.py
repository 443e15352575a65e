"""``qrnn-train``'s settings, defined once: :class:`Settings`, whose fields carry each
flag's default, help text, parser and what resuming does with it; the command line
parser is built from it (:func:`build_parser`) and a run's values are resolved against a
checkpoint by :func:`resolve`.

What resuming does with a field (``resume=``): ``FIXED``, the checkpoint fixes it and a
different explicit value is an error; ``KEPT``, the checkpoint's value unless the flag is
given; ``None``, a run option, never saved.

``--preset NAME`` (:data:`PRESETS`) replaces the defaults of saved settings with a published
recipe's; a flag given still wins, and so does a resumed checkpoint's value.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import os
from dataclasses import dataclass, field
from typing import Any, Optional

from .checkpoints import CHECKPOINT_FORMATS, CheckpointConfig
from .data import DataConfig
from .distributed import DEFAULT_DIST_TIMEOUT
from .errors import TrainError
from .lm import ModelConfig
from .optim import OPTIMIZERS, OptimizerConfig
from .precision import PRECISIONS, PrecisionConfig
from .softmax import ADAPTIVE_ABOVE
from .stopping import DEFAULT_STOP_GRACE, StopConfig

__all__ = ["Settings", "build_parser", "resolve", "FIXED", "KEPT", "positive_int", "positive_float", "seed_int",
           "CommandParser", "PRESETS", "PRESET_LRS", "preset_of", "lr_note",
           "chosen_softmax"]

FIXED = "fixed"
KEPT = "kept"


class CommandParser(argparse.ArgumentParser):
    def error(self, message):  # one line, no usage block
        self.exit(2, f"{self.prog}: error: {message}\n")


def _checked(kind, accepts, expected: str):
    """An argparse type: `kind(text)` when `accepts` it, else "expected <expected>, got <text>"."""
    def parse(text):
        try:
            value = kind(text)
        except ValueError:
            value = None
        if value is None or not accepts(value):
            raise argparse.ArgumentTypeError(f"expected {expected}, got {text!r}")
        return value
    return parse


positive_int = _checked(int, lambda value: value > 0, "a positive int")
positive_float = _checked(float, lambda value: value > 0 and math.isfinite(value), "a positive float")
_non_negative_int = _checked(int, lambda value: value >= 0, "an int >= 0")
_fraction = _checked(float, lambda value: 0.0 <= value < 1.0, "a number in [0, 1)")
_non_negative_float = _checked(float, lambda value: value >= 0 and math.isfinite(value), "a number >= 0")
_auto = _checked(str, lambda value: value == "auto", "auto (or no value)")
# torch.manual_seed takes a 64-bit seed, and each rank adds its rank to it.
seed_int = _checked(int, lambda value: -2**63 <= value < 2**63 - 2**16, "an int in [-2**63, 2**63 - 2**16)")


def _flag(default, help: str, group: str, *, resume: Optional[str] = None, shown: Optional[str] = None,
          **argparse_options) -> Any:
    """A field of Settings: its default, its flag's help (`shown`: the default as the help
    shows it, "" for none; None: the default itself unless it is None) and argparse options,
    and what resuming does with it."""
    return field(default=default, metadata=dict(help=help, group=group, resume=resume, shown=shown,
                                                options=argparse_options))


@dataclass(frozen=True)
class Settings:
    """Every ``qrnn-train`` flag as a field of a frozen dataclass (``--batch-size`` is
    ``batch_size``), with the flag's default. On a 2-core CPU the default run takes about two
    minutes.

    Each field's metadata holds the flag's help text, its argparse options, its group in
    ``--help`` and what resuming does with it (``resume``: ``FIXED``, the checkpoint's value
    and a different explicit one is an error; ``KEPT``, the checkpoint's value unless the
    flag is given; None, a run option never saved). ``dropouth`` and ``dropouti`` left None
    take ``dropout``'s rate on construction. Units are the command line's: ``time_budget``,
    ``stop_grace`` and ``dist_timeout`` in seconds, ``save_interval`` in minutes. The
    constructor checks nothing; the command line's parser checks each value.

    Settings composes the configs of the components that use them, each defined beside its
    component and taking the flags' values in the flags' units: :attr:`data_config`,
    :attr:`model_config`, :attr:`optimizer_config`, :attr:`precision_config`,
    :attr:`checkpoint_config` and :attr:`stop_config`.
    """

    data: Optional[str] = _flag(None, "folder with train.txt, valid.txt, test.txt, or one text file split 90/5/5",
                                "data", resume=KEPT, shown="the reference text in Python's pydoc_data",
                                metavar="PATH")
    preset: Optional[str] = _flag(None, "a published AWD-QRNN recipe as the defaults (awd-lstm-lm's README): "
                                  "PTB, WikiText-2, WikiText-103; flags given still override", "recipe",
                                  resume=KEPT, shown="", choices=("awd-qrnn-ptb", "awd-qrnn-wt2", "awd-qrnn-wt103"))
    level: str = _flag("char", "tokens", "data", resume=FIXED, choices=("char", "word"))
    layers: int = _flag(3, "QRNN layers", "model", resume=FIXED, type=positive_int, metavar="N")
    hidden: int = _flag(256, "QRNN hidden size", "model", resume=FIXED, type=positive_int, metavar="N")
    emsize: int = _flag(128, "embedding size", "model", resume=FIXED, type=positive_int, metavar="N")
    softmax: str = _flag("auto", "output softmax: adaptive (awd-lstm-lm's split softmax over the tied embedding, for "
                         "large vocabularies) or full; auto: adaptive above 75,000 words", "model", resume=FIXED,
                         choices=("auto", "full", "adaptive"))
    cutoffs: tuple = _flag((), "adaptive softmax: where the head and each tail cluster end (word ranks)", "model",
                           resume=FIXED, shown="2800 20000 76000 above 75,000 words (awd-lstm-lm's), else a "
                           "twentieth and a quarter of the words", type=positive_int, nargs="+", metavar="RANK")
    window: int = _flag(2, "the first layer's window (inputs each step reads; the other layers read 1)", "model",
                        resume=FIXED, type=positive_int, metavar="N")
    dropout: float = _flag(0.1, "locked dropout on the last layer's output", "regularisation", resume=FIXED,
                           type=_fraction, metavar="P")
    # None: --dropout's rate (filled in on construction), so that --dropout 0 turns every dropout off.
    dropouth: Optional[float] = _flag(None, "locked dropout between QRNN layers", "regularisation", resume=FIXED,
                                      shown="--dropout", type=_fraction, metavar="P")
    dropouti: Optional[float] = _flag(None, "locked dropout on the embedded input", "regularisation",
                                      resume=FIXED, shown="--dropout", type=_fraction, metavar="P")
    dropoute: float = _flag(0.0, "dropout of whole words from the embedding", "regularisation", resume=FIXED,
                            type=_fraction, metavar="P")
    wdrop: float = _flag(0.0, "DropConnect on each QRNN layer's gate weights", "regularisation", resume=FIXED,
                         type=_fraction, metavar="P")
    alpha: float = _flag(0.0, "activation regularisation: ALPHA * mean(output**2) of the dropped last-layer output",
                         "regularisation", resume=FIXED, type=_non_negative_float, metavar="ALPHA")
    beta: float = _flag(0.0, "temporal activation regularisation: BETA * mean((raw[t] - raw[t-1])**2) of the raw "
                        "last-layer output", "regularisation", resume=FIXED, type=_non_negative_float, metavar="BETA")
    wdecay: float = _flag(0.0, "weight decay (L2, in the optimizer)", "regularisation", resume=FIXED,
                          type=_non_negative_float, metavar="W")
    epochs: int = _flag(4, "total epochs, counting resumed ones", "training", resume=KEPT, type=positive_int,
                        metavar="N")
    max_steps: Optional[int] = _flag(None, "stop after this many optimizer steps in all", "training",
                                     type=positive_int, metavar="N")
    time_budget: Optional[float] = _flag(None, "stop after this many seconds", "training", type=positive_float,
                                         metavar="SECONDS")
    batch_size: int = _flag(16, "global batch size", "training", resume=FIXED, type=positive_int, metavar="N")
    eval_batch_size: Optional[int] = _flag(None, "global batch size of validation and test", "training",
                                           resume=KEPT, shown="--batch-size", type=positive_int, metavar="N")
    bptt: int = _flag(64, "truncated-BPTT chunk length", "training", resume=FIXED, type=positive_int, metavar="N")
    bptt_lengths: str = _flag("fixed", "random: awd-lstm-lm's chunk lengths (about --bptt, half of it 5%% of the "
                              "time) with each step's learning rate scaled by length / --bptt", "training",
                              resume=FIXED, choices=("fixed", "random"))
    lr: float = _flag(5e-3, "learning rate; a preset's is its --optimizer's (awd-lstm-lm's: 30 for sgd and asgd, "
                      "0.001 for adam)", "training", resume=FIXED, type=positive_float, metavar="LR")
    optimizer: str = _flag("adam", "the optimizer; asgd: SGD, switching to averaged SGD when validation stops "
                           "improving (awd-lstm-lm's NT-ASGD; validation, test and samples then use the averaged "
                           "weights)", "training", resume=FIXED, choices=OPTIMIZERS)
    nonmono: int = _flag(5, "asgd: switch when validation is worse than the best before the last N epochs",
                         "training", resume=FIXED, type=positive_int, metavar="N")
    when: tuple = _flag((), "divide the learning rate by 10 after each of these epochs", "training", resume=FIXED,
                        shown="never", type=positive_int, nargs="+", metavar="EPOCH")
    warmup: int = _flag(100, "linear warm-up steps (0: none)", "training", resume=FIXED, type=_non_negative_int,
                        metavar="N")
    clip: float = _flag(0.25, "gradient-norm clip", "training", resume=FIXED, type=positive_float, metavar="NORM")
    precision: str = _flag("auto", "autocast precision; auto: fp16 on CUDA, bf16 on a CPU with native bf16, "
                           "else fp32", "training", resume=KEPT, choices=PRECISIONS)
    seed: int = _flag(1234, "random seed", "training", resume=FIXED, type=seed_int, metavar="N")
    device: Optional[str] = _flag(None, "cpu, cuda, cuda:N", "training", shown="cuda when available")
    checkpoint_dir: Optional[str] = _flag(None, "run folder: checkpoints, best.pt, metrics.jsonl, loss.png",
                                          "checkpoints and output", shown="runs/<date-time>", metavar="DIR")
    keep_last: int = _flag(3, "checkpoints kept", "checkpoints and output", type=positive_int, metavar="N")
    checkpoint_format: str = _flag("file", "file: rank 0 writes each checkpoint as one torch.save file; dcp: every "
                                   "rank writes its part of a torch.distributed.checkpoint folder step-<n>, "
                                   "without gathering (qrnn.checkpoint.dcp)", "checkpoints and output",
                                   resume=KEPT, choices=CHECKPOINT_FORMATS)
    resume: Any = _flag(None, "continue from the latest checkpoint in --checkpoint-dir (default: the one "
                        "unfinished run under runs/, else the newest; several unfinished: it asks which); "
                        "--resume auto: continue if --checkpoint-dir holds a checkpoint, else "
                        "start there (one command line for first starts, restarts and requeues)",
                        "checkpoints and output", shown="", nargs="?", const=True, type=_auto, metavar="auto")
    save_every: Optional[int] = _flag(None, "also checkpoint every STEPS optimizer steps, mid-epoch",
                                      "checkpoints and output", type=positive_int, metavar="STEPS")
    save_interval: Optional[float] = _flag(None, "also checkpoint every MINUTES minutes (rank 0's clock), mid-epoch",
                                           "checkpoints and output", type=positive_float, metavar="MINUTES")
    sample_length: int = _flag(300, "tokens generated at the end", "checkpoints and output", shown="300; 0: none",
                               type=_non_negative_int, metavar="N")
    no_progress: bool = _flag(False, "no progress bar", "checkpoints and output", shown="", action="store_true")
    stop_grace: float = _flag(DEFAULT_STOP_GRACE, "on SIGTERM, SIGUSR1 or Ctrl-C: stop at the next step, checkpoint "
                              "it and exit with 128 + the signal within SECONDS, else exit at once (a second "
                              "Ctrl-C: at once)", "stops and faults",
                              type=positive_float, metavar="SECONDS")
    dist_timeout: float = _flag(DEFAULT_DIST_TIMEOUT, "under torchrun: how long a collective waits for a hung or "
                                "dead peer before the run fails", "stops and faults", type=positive_float,
                                metavar="SECONDS")

    def __post_init__(self):
        for name in ("dropouth", "dropouti"):  # None: --dropout's rate
            if getattr(self, name) is None:
                object.__setattr__(self, name, self.dropout)

    def saved(self) -> dict:
        """The settings a checkpoint records (the fields resuming keeps or fixes)."""
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.metadata["resume"]}

    # ---- the components' configs (no unit converted: each takes its flags' own)
    @property
    def data_config(self) -> DataConfig:
        """The corpus and its batches."""
        return DataConfig(self.data, self.level, self.batch_size, self.eval_batch_size, self.bptt, self.bptt_lengths)

    @property
    def model_config(self) -> ModelConfig:
        """The language model and its loss's regularisers."""
        dropouti, dropouth = self.dropouti, self.dropouth
        assert dropouti is not None and dropouth is not None  # construction gave them --dropout's rate
        return ModelConfig(emsize=self.emsize, hidden=self.hidden, layers=self.layers, first_window=self.window,
                           dropout=self.dropout, dropout_emb=dropouti, dropout_hidden=dropouth,
                           dropout_words=self.dropoute, weight_drop=self.wdrop, softmax=self.softmax,
                           cutoffs=self.cutoffs, alpha=self.alpha, beta=self.beta)

    @property
    def optimizer_config(self) -> OptimizerConfig:
        """The optimizer and each step's learning rate."""
        return OptimizerConfig(self.optimizer, self.lr, weight_decay=self.wdecay, warmup=self.warmup, when=self.when,
                               nonmono=self.nonmono)

    @property
    def precision_config(self) -> PrecisionConfig:
        """The Trainer's precision and gradient clipping."""
        return PrecisionConfig(self.precision, clip_norm=self.clip)

    @property
    def checkpoint_config(self) -> CheckpointConfig:
        """Where (``checkpoint_dir``; qrnn-train's run folder replaces it) and when the Trainer checkpoints."""
        return CheckpointConfig(self.checkpoint_dir, keep_last=self.keep_last, save_every=self.save_every,
                                save_interval=self.save_interval, format=self.checkpoint_format)

    @property
    def stop_config(self) -> StopConfig:
        """How the Trainer stops on a signal."""
        return StopConfig(grace=self.stop_grace)


# awd-lstm-lm's QRNN recipes from its README: each command's flags over main.py's defaults
# (random BPTT lengths, SGD switching to averaged SGD, tied weights, window 2 in the first
# layer, evaluation batch 10), as this command's settings.
_AWD_DEFAULTS = dict(level="word", layers=3, hidden=1150, emsize=400, window=2, dropout=0.4, dropouth=0.3,
                     dropouti=0.65, dropoute=0.1, wdrop=0.5, alpha=2.0, beta=1.0, wdecay=1.2e-6, batch_size=80,
                     eval_batch_size=10, bptt=70, bptt_lengths="random", lr=30.0, optimizer="asgd", nonmono=5,
                     when=(), warmup=0, clip=0.25, seed=1111)
PRESETS = {
    # ~ 60.6 / 58.3 validation / test perplexity
    "awd-qrnn-ptb": dict(_AWD_DEFAULTS, batch_size=20, clip=0.2, wdrop=0.1, hidden=1550, layers=4, emsize=400,
                         dropouth=0.3, seed=9001, dropouti=0.4, epochs=550),
    # ~ 69.3 / 66.8
    "awd-qrnn-wt2": dict(_AWD_DEFAULTS, epochs=500, clip=0.25, dropouti=0.4, dropouth=0.2, hidden=1550, layers=4,
                         seed=4002, wdrop=0.1, batch_size=40),
    "awd-qrnn-wt103": dict(_AWD_DEFAULTS, epochs=14, layers=4, emsize=400, hidden=2500, alpha=0.0, beta=0.0,
                           dropoute=0.0, dropouth=0.1, dropouti=0.1, dropout=0.1, wdrop=0.0, wdecay=0.0, bptt=140,
                           batch_size=60, optimizer="adam", lr=1e-3, when=(12,)),
}


# awd-lstm-lm's learning rate of each optimizer (main.py's SGD default; its WT-103 QRNN
# command's Adam lr): a preset's lr belongs to its optimizer, so --optimizer without --lr
# takes this one, not 30 for Adam.
_AWD_LRS = {"adam": 1e-3, "sgd": 30.0, "asgd": 30.0}
PRESET_LRS = {name: _AWD_LRS for name in PRESETS}


def lr_note(settings: Settings) -> str:
    """Where the lr of a run whose optimizer is not its preset's (or the default's) comes
    from, when it is that optimizer's lr rather than the one the preset's optimizer uses
    ("": nothing to say)."""
    if settings.preset in PRESETS:
        preset = PRESETS[settings.preset]
        lr = PRESET_LRS[settings.preset].get(settings.optimizer)
        if settings.optimizer != preset["optimizer"] and settings.lr == lr != preset["lr"]:
            return (f"the preset's lr for {settings.optimizer}; its {preset['lr']:g} is {preset['optimizer']}'s: "
                    "--lr sets another")
        return ""
    default = Settings()
    if settings.optimizer != default.optimizer and settings.lr == default.lr:
        return f"the default lr, {default.optimizer}'s: --lr sets another"
    return ""


def preset_of(argv) -> Optional[str]:
    """The --preset given in `argv` (None: none or not a known one; the full parser reports that)."""
    parser = argparse.ArgumentParser(add_help=False)
    parser.add_argument("--preset")
    known, _ = parser.parse_known_args(argv)
    return known.preset if known.preset in PRESETS else None


def _default(f: dataclasses.Field, preset: Optional[str]):
    return PRESETS[preset].get(f.name, f.default) if preset else f.default


def build_parser(preset: Optional[str] = None) -> argparse.ArgumentParser:
    """``qrnn-train``'s parser, one flag per :class:`Settings` field, its help showing the
    defaults of `preset` where given. A saved setting's flag defaults to None, so that
    :func:`resolve` tells a given value from the default."""
    parser = CommandParser(prog="qrnn-train", description="Train a QRNN language model (mixed precision, "
                           "non-blocking checkpoints, resumable, one or many processes via torchrun).")
    groups: dict = {}
    for f in dataclasses.fields(Settings):
        meta = f.metadata
        group = groups.get(meta["group"]) or groups.setdefault(meta["group"], parser.add_argument_group(meta["group"]))
        shown, default = meta["shown"], _default(f, preset)
        if shown is None or default != f.default:  # the default itself, if any
            shown = _show(default)
        help_text = meta["help"] + (f" (default: {shown})" if shown else "")
        default = None if meta["resume"] else f.default
        group.add_argument("--" + f.name.replace("_", "-"), default=default, help=help_text, **meta["options"])
    return parser


def _check_saved(saved: dict) -> None:
    """A checkpoint's settings obey the rules of their flags (a file is untrusted input: its
    numbers size the model and the batches): each value of its field's type, through the
    flag's own parser and choices; TrainError naming the first that does not."""
    for f in dataclasses.fields(Settings):
        if f.name not in saved or not f.metadata["resume"]:
            continue
        value, options = saved[f.name], f.metadata["options"]
        flag = "--" + f.name.replace("_", "-")
        values = value if options.get("nargs") == "+" else [value]
        if options.get("nargs") == "+" and (not isinstance(value, (list, tuple)) or len(value) > _MAX_SAVED_ITEMS):
            raise TrainError(f"the checkpoint's {flag} is damaged: expected at most {_MAX_SAVED_ITEMS} values")
        for item in values:
            if item is None and f.default is None:
                continue
            problem = _saved_problem(item, options)
            if problem:
                raise TrainError(f"the checkpoint's {flag} is damaged: {problem}")


_MAX_SAVED_ITEMS = 64
_MAX_SAVED_TEXT = 4096


def _saved_problem(value, options: dict) -> Optional[str]:
    """Why a saved value would not have come from its flag, or None."""
    if "choices" in options:
        return None if isinstance(value, str) and value in options["choices"] else f"got {value!r:.80}"
    parse = options.get("type")
    if parse is None:  # a free text (--data)
        ok = isinstance(value, str) and len(value) <= _MAX_SAVED_TEXT and "\0" not in value
        return None if ok else f"expected a path, got {type(value).__name__}"
    if isinstance(value, bool) or not isinstance(value, (int, float)) or abs(value) >= 2**64:
        return f"expected a number, got {value!r:.40}"
    try:
        parse(repr(value))  # an int flag refuses a float's "2.0"
    except argparse.ArgumentTypeError as err:
        return str(err)
    return None


def _show(value) -> str:
    if value is None:
        return ""
    if isinstance(value, float):
        return f"{value:g}"
    if isinstance(value, tuple):
        return " ".join(map(str, value)) or "never"
    return str(value)


def chosen_softmax(softmax: str, vocab_size: int) -> str:
    """The softmax ``--softmax`` gives a vocabulary of `vocab_size` words: auto is adaptive
    above 75,000 words (awd-lstm-lm's rule), else full."""
    if softmax != "auto":
        return softmax
    return "adaptive" if vocab_size > ADAPTIVE_ABOVE else "full"


def _softmax_trained(checkpoint: dict) -> Optional[str]:
    """The softmax a checkpoint's model has (its cutoffs: none for the full one); None when
    its model settings do not say (a damaged file, refused later)."""
    config = checkpoint.get("model_config")
    if not isinstance(config, dict) or not isinstance(config.get("vocab_size"), int):
        return None
    return "full" if config.get("cutoffs") is None else "adaptive"


def resolve(args: argparse.Namespace, checkpoint: Optional[dict]) -> Settings:
    """The run's settings: a saved setting is the flag given, else the checkpoint's, else the
    preset's, else the default (a given value that differs from a fixed one in the checkpoint
    is a TrainError); a run option is the flag's value."""
    saved = checkpoint["settings"] if checkpoint else {}
    _check_saved(saved)
    preset = args.preset if args.preset is not None else saved.get("preset")
    values = {}
    preset_defaults = set()  # the fields that take the preset's value (or the default)
    for f in dataclasses.fields(Settings):
        given, resume = getattr(args, f.name), f.metadata["resume"]
        if isinstance(given, list):  # nargs="+"
            given = tuple(given)
        if resume == FIXED and checkpoint and given is not None and given != saved.get(f.name):
            flag = "--" + f.name.replace("_", "-")
            trained = f"{flag} {saved.get(f.name)}"
            if f.name == "softmax":  # what auto chose is what the run trained with
                chose = _softmax_trained(checkpoint)
                if chose is not None and chosen_softmax(given, checkpoint["model_config"]["vocab_size"]) == chose:
                    values[f.name] = saved[f.name]  # the same softmax: the checkpoint's value stays
                    continue
                if chose is not None and saved.get(f.name) == "auto":
                    trained += f" (which chose {chose})"
            raise TrainError(f"{flag} {given} conflicts with the checkpoint, trained with {trained}: resume without "
                             f"{flag}, or start a new run in another --checkpoint-dir")
        if given is not None or not resume:
            values[f.name] = given
        elif f.name in saved:
            values[f.name] = tuple(saved[f.name]) if isinstance(f.default, tuple) else saved[f.name]
        else:
            values[f.name] = _default(f, preset)
            preset_defaults.add(f.name)
    if preset in PRESET_LRS and "lr" in preset_defaults:  # the lr of the optimizer it runs
        values["lr"] = PRESET_LRS[preset].get(values["optimizer"], values["lr"])
    if args.data is not None:  # so that --resume finds it from any working folder
        values["data"] = os.path.abspath(args.data)
    return Settings(**values)
