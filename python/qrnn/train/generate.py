"""The ``qrnn-generate`` command: sample text from a model ``qrnn-train`` saved (a checkpoint
file, or a run folder's best.pt, else its latest checkpoint), after the checks an untrusted
file must pass; :func:`sample_text` is also what ``qrnn-train`` prints at its end."""

from __future__ import annotations

import os

import torch

from .checkpoints import is_sharded_checkpoint, load_checkpoint
from .distributed import check_device
from .errors import TrainError
from .lm import QRNNLanguageModel, generate
from .optim import averaged_state_dict
from .records import plural
from .report import USER_ERRORS, report_error
from .runs import latest_checkpoint
from .settings import CommandParser, positive_float, positive_int, seed_int
from .setup import GENERATE_KEYS, check_checkpoint, check_model_shapes, checkpoint_vocabulary

__all__ = ["generate_main", "sample_text"]


def sample_text(model, vocab, prompt: str, length: int, temperature: float, seed: int) -> str:
    """`prompt` and `length` tokens `model` samples after it (from a line start when `prompt`
    is empty), decoded with `vocab`; seeded by `seed`, on the model's device."""
    shown = prompt
    if not prompt:  # start at a line start
        prompt = "\n" if vocab.level == "char" else "<eos>"
    ids = vocab.encode(prompt)
    if ids.numel() == 0:
        raise TrainError("--prompt holds no tokens")
    device = next(model.parameters()).device
    generator = torch.Generator(device=device)
    generator.manual_seed(seed)
    out = generate(model, ids, length, temperature, generator)
    separator = "" if vocab.level == "char" or not shown else " "
    return shown + separator + vocab.decode(out)


def generate_main(argv=None) -> int:
    """The ``qrnn-generate`` command: sample text from a model ``qrnn-train`` saved.

    Args:
        argv (list[str] | None): the command line's arguments (``--checkpoint PATH`` and the
            sampling flags; see ``qrnn-generate --help``); None: ``sys.argv[1:]``.

    Returns:
        The exit code: 0, or 2 for any failure, reported in one line on stderr (a bad
        command line, and ``--help``, end in argparse's SystemExit instead).
    """
    p = CommandParser(prog="qrnn-generate", description="Sample text from a model saved by qrnn-train.")
    p.add_argument("--checkpoint", required=True, metavar="PATH",
                   help="a checkpoint file, or a run folder (its best.pt, else its latest checkpoint)")
    p.add_argument("--prompt", default="", help="text to continue (default: start of a line)")
    p.add_argument("--length", type=positive_int, default=300, help="tokens to generate (default: 300)")
    p.add_argument("--temperature", type=positive_float, default=0.8,
                   help="softmax temperature; one so small that the logits overflow when divided by it picks the "
                   "most likely token each step (greedy) (default: 0.8)")
    p.add_argument("--seed", type=seed_int, metavar="N", default=0, help="sampling seed (default: 0)")
    p.add_argument("--device", default="cpu", help="cpu, cuda, cuda:N (default: cpu)")
    args = p.parse_args(argv)
    try:
        device = check_device(args.device)  # before a checkpoint is read
        path = args.checkpoint
        if os.path.isdir(path) and not is_sharded_checkpoint(path):
            best = os.path.join(path, "best.pt")
            path = best if os.path.exists(best) else latest_checkpoint(path)
            if path is None:
                raise TrainError(f"--checkpoint {args.checkpoint}: folder holds no checkpoint")
        state = load_checkpoint(path)
        check_checkpoint(state, path, GENERATE_KEYS)
        vocab = checkpoint_vocabulary(state, path)
        check_model_shapes(state["model_config"], state.get("model"), path)
        if state["model_config"].get("vocab_size") != len(vocab):
            raise TrainError(f"{path}: its vocabulary has {plural(len(vocab), 'entry', 'entries')}, its model "
                             f"{state['model_config'].get('vocab_size')!r:.20}")
        try:
            model = QRNNLanguageModel(**state["model_config"])
            model.load_state_dict(state["model"])
            averaged = averaged_state_dict(model, state.get("optimizer") or {})
            if averaged is not None:  # trained with averaged SGD: sample from the average
                model.load_state_dict(averaged)
            model.to(device)
        except (RuntimeError, KeyError, ValueError, TypeError) as err:
            raise TrainError(f"cannot rebuild the model from {path}: {str(err).strip().splitlines()[0]}") from None
        print(sample_text(model, vocab, args.prompt, args.length, args.temperature, args.seed))
        return 0
    except USER_ERRORS as err:
        return report_error("qrnn-generate", err)
