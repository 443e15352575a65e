"""Benchmarks: ``python -m qrnn.bench [area ...] [--quick]``. Each area module has
``run(quick) -> list[Result]``; every target is a ratio measured within one run."""

# Sub-command name -> module (under qrnn.bench) holding its run(quick).
AREAS = {
    "forget-mult": "forget_mult",
    "linear-scan": "linear_scan",
    "sequences": "sequences",
    "layer": "layer",
    "checkpoint": "checkpoint",
    "dcp": "dcp",
    "train": "train",
    "cuda": "cuda",
    "recipes": "recipes",
    "awd": "awd",
    "scale": "scale",
    "tokenize": "tokenization",
}
