"""``python -m qrnn.train`` (and ``torchrun ... -m qrnn.train``): the ``qrnn-train`` command."""

from .cli import main

if __name__ == "__main__":
    raise SystemExit(main())
