"""The error of a training run that the user can fix, and the exit of a run stopped by a signal."""

__all__ = ["TrainError", "TrainingStopped"]


class TrainError(RuntimeError):
    """A problem the user can fix (bad flag, data, checkpoint), as a RuntimeError whose
    message is one line; ``qrnn-train`` prints it and exits with status 2."""


class TrainingStopped(SystemExit):
    """Raised by :meth:`Trainer.fit` after a stop signal (SIGTERM, SIGUSR1), once the position
    reached is checkpointed and every save committed. Its exit code is 128 + the signal
    number (143 for SIGTERM, 138 for SIGUSR1): what a shell reports for a process the signal
    ended, so schedulers see a terminated job. ``signum`` is the signal and ``step`` the
    optimizer step checkpointed; ``code`` (SystemExit's) the exit status."""

    def __init__(self, signum: int, step: int):
        super().__init__(128 + signum)
        self.signum = signum
        self.step = step
