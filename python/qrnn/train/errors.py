"""The error of a training run that the user can fix."""

__all__ = ["TrainError"]


class TrainError(RuntimeError):
    """A problem the user can fix (bad flag, data, checkpoint); the command line prints it on one line."""
