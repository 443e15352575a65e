"""The ``qrnn-train`` command (also ``python -m qrnn.train``; ``torchrun --nproc_per_node=N -m
qrnn.train ...`` trains on N processes): its command line, then a run built by
:mod:`qrnn.train.setup` in a run folder found by :mod:`qrnn.train.runs`, trained by
:class:`qrnn.train.Trainer` and reported by :mod:`qrnn.train.report` (checkpoints, best.pt,
metrics.jsonl, loss.png). ``qrnn-generate`` is :mod:`qrnn.train.generate`."""

from __future__ import annotations

import gc
import sys

import torch

from .checkpoints import load_checkpoint, restore_best
from .distributed import check_ranks_in_sync, collective_failure_message, init_distributed, is_collective_failure
from .errors import TrainingStopped
from .generate import generate_main, sample_text
from .optim import averaged_weights
from .report import USER_ERRORS, epoch_reporter, final_loss_line, report_error, stop_line
from .runs import _finished, _locate_run, _remove_if_empty
from .settings import build_parser, preset_of, resolve
from .setup import RESUME_KEYS, build_training, check_application_dependencies, check_checkpoint, check_stored_data
from .stopping import catch_stop_signals, with_ctrl_c

__all__ = ["main", "generate_main"]


def main(argv=None) -> int:
    """The ``qrnn-train`` command (also ``python -m qrnn.train``).

    Args:
        argv (list[str] | None): the command line's arguments (the flags :class:`Settings`
            names); None: ``sys.argv[1:]``.

    Returns:
        The exit code: 0, also when a resumed run has already finished its epochs (one line
        on stderr says so; nothing is trained); 2 for usage, data, checkpoint and I/O errors,
        a run folder another process holds (refused at start-up, naming it), a bare
        ``--resume`` with several unfinished runs under runs/, and failed collectives, each
        one line on stderr; 128 + the signal after a stop by SIGTERM, SIGUSR1 or Ctrl-C (143,
        138, 130), once the position reached is checkpointed (one line on stderr names the
        file and how to continue); 130 too for a second Ctrl-C, which exits at once. A bad
        command line (and ``--help``) ends in argparse's SystemExit instead (status 2 with
        one line; 0 for ``--help``).
    """
    args = build_parser(preset_of(sys.argv[1:] if argv is None else argv)).parse_args(argv)
    try:
        # From the start, so that a signal during set-up is a stop request too (and a PID 1
        # of a container reacts to SIGTERM at all). Ctrl-C too: it saves like SIGTERM.
        with catch_stop_signals(with_ctrl_c(), args.stop_grace):
            return _train(args)
    finally:
        # DistributedDataParallel sits in reference cycles: collect it (and the process group
        # it holds) now, while Python is whole, not during interpreter shutdown, where
        # torch 2.4's gloo teardown can abort ("terminate called without an active exception").
        gc.collect()


def _train(args) -> int:
    prog = "qrnn-train"
    dist = trainer = run = writer = None
    created: list = []
    try:
        dist = init_distributed(args.device, args.dist_timeout)
        say = print if dist.is_main else (lambda *a, **k: None)
        run_dir, resume_path, created, writer = _locate_run(args, dist, say)
        checkpoint = load_checkpoint(resume_path) if resume_path else None
        if checkpoint is not None:
            check_checkpoint(checkpoint, resume_path, RESUME_KEYS)
        settings = resolve(args, checkpoint)
        finished = _finished(checkpoint, settings.epochs) if checkpoint is not None else None
        if checkpoint is not None and finished is not None:
            # Exit status 0, not an error: a requeued or restarted job that is done must
            # neither fail nor loop (Kubernetes restarts a container that exits non-zero).
            epochs, step = finished
            if dist.is_main:  # a kill may have cut the last best.pt promotion short
                best_step = checkpoint["progress"].get("best_step")
                restore_best(run_dir, best_step if type(best_step) is int and 0 <= best_step < 2**63 else None,
                             writer)
                print(f"{prog}: {run_dir} has finished its {epochs} epoch{'s' if epochs != 1 else ''} (step "
                      f"{step}): nothing to train; pass --epochs N above {epochs} to train it further",
                      file=sys.stderr)
            return 0
        if checkpoint is not None and args.data is None and settings.data is not None:
            check_stored_data(settings.data, checkpoint, resume_path)
        check_application_dependencies(settings)
        run = build_training(settings, dist, run_dir, checkpoint, resume_path, say, writer=writer)
        trainer, corpus = run.trainer, run.corpus
        trainer.fit(run.train_batches, run.valid_batches, epochs=settings.epochs, max_steps=settings.max_steps,
                    time_budget=settings.time_budget, on_epoch_end=epoch_reporter(trainer, settings.level, say))
        say(final_loss_line(trainer.evaluate(run.test_batches), settings.level))
        if dist.enabled:
            say(check_ranks_in_sync(trainer.module, dist))
        if dist.is_main and settings.sample_length > 0:
            with averaged_weights(trainer.optimizer):
                sample = sample_text(trainer.module, corpus.vocab, "", settings.sample_length, 0.8, settings.seed)
            say("sample:\n" + sample)
        best = ", best.pt" if settings.checkpoint_format == "file" else ""  # a dcp step folder has no second name
        say(f"saved in {run_dir}: checkpoints{best}, metrics.jsonl, loss.png")
        return 0
    except USER_ERRORS as err:
        return report_error(prog, err)
    except TrainingStopped as stop:
        assert trainer is not None and run is not None and dist is not None  # only fit() raises it
        print(f"{prog}: {stop_line(stop, trainer, len(run.train_batches), dist)}", file=sys.stderr)
        return 128 + stop.signum
    except RuntimeError as err:
        if dist is None or not is_collective_failure(err, dist):
            raise
        where = f"at step {trainer.step}" if trainer is not None else "during set-up"
        return report_error(prog, collective_failure_message(err, dist, where))
    except KeyboardInterrupt:
        print(f"{prog}: interrupted", file=sys.stderr)
        return 130
    finally:
        if writer is not None:  # closed with the trainer, unless set-up failed first
            writer.close()
        _remove_if_empty(created)
        if dist is not None and dist.enabled and torch.distributed.is_initialized():
            torch.distributed.destroy_process_group()
