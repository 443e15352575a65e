"""qrnn-train with faults injected where the environment says (for the tests' subprocesses).

FAULT="SIGNAL@WHERE@N[@RANK]" sends SIGNAL (a signal.Signals name) to this process once per
launch (FAULT_ONCE: a file created when it fires, so restarted workers run clean; several
faults, comma-separated, each get their own such file: FAULT_ONCE, then FAULT_ONCE.1, ...):
  WHERE=step: during optimizer step N; WHERE=save: right after the N-th save was handed to
  the writer (it is in flight); WHERE=best: at the N-th promotion of best.pt, before it;
  WHERE=hang: right after the N-th save, and then the main thread sleeps for ten minutes.
CLOCK="RANK@FACTOR": the training loop of that rank reads a monotonic clock running FACTOR
times too fast (ranks whose clocks disagree).
EXIT_LOG: a folder that receives, per rank and torchrun attempt, the exit code main returned.
"""

import os
import signal
import sys
import time
import types

import qrnn.checkpoint
import qrnn.train.checkpoints
import qrnn.train.cli
import qrnn.train.trainer

rank = os.environ.get("RANK", "0")


def install(spec, once_file):
    name, where, count, *only = spec.split("@")
    if not only or only[0] == rank:
        number, calls = int(count), []

        def fire():
            calls.append(None)
            if len(calls) != number:
                return
            try:  # once per launch, whichever rank or attempt gets here first
                os.close(os.open(once_file, os.O_CREAT | os.O_EXCL | os.O_WRONLY))
            except FileExistsError:
                return
            os.kill(os.getpid(), getattr(signal, name))

        def around(owner, attribute, before):
            original = getattr(owner, attribute)

            def call(*args, **kwargs):
                if before:
                    fire()
                result = original(*args, **kwargs)
                if not before:
                    fire()
                return result
            setattr(owner, attribute, call)

        if where == "step":
            around(qrnn.train.trainer.Trainer, "train_step", before=True)
        elif where == "save":
            around(qrnn.checkpoint.AsyncCheckpointer, "save", before=False)
        elif where == "hang":
            around(qrnn.checkpoint.AsyncCheckpointer, "save", before=False)
            fire_once = fire

            def fire():
                fire_once()
                if len(calls) == number:
                    time.sleep(600)
        elif where == "best":
            around(qrnn.train.checkpoints, "_write_best", before=True)
        else:
            raise SystemExit(f"fault_launcher: unknown place {where!r}")


for index, spec in enumerate(filter(None, os.environ.get("FAULT", "").split(","))):
    install(spec, os.environ["FAULT_ONCE"] + (f".{index}" if index else ""))

clock = os.environ.get("CLOCK", "")
if clock and clock.split("@")[0] == rank:
    factor, start = float(clock.split("@")[1]), time.monotonic()
    qrnn.train.trainer.time = types.SimpleNamespace(
        monotonic=lambda: start + factor * (time.monotonic() - start), perf_counter=time.perf_counter)

code = qrnn.train.cli.main(sys.argv[1:])
if os.environ.get("EXIT_LOG"):
    attempt = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
    with open(os.path.join(os.environ["EXIT_LOG"], f"rank{rank}-attempt{attempt}"), "w") as fh:
        fh.write(str(code))
sys.exit(code)
