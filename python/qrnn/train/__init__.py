"""Mixed-precision training with non-blocking checkpoints, on one process or many: the
``qrnn-train`` application.

Library: :class:`Trainer` (and :func:`fit`) runs any model over batches with
``torch.autocast``, a ``torch.amp.GradScaler`` for float16, gradient clipping after
unscaling, truncated BPTT with the carried state detached between chunks, checkpoints
through :class:`qrnn.checkpoint.AsyncCheckpointer`, exact resume (model, optimizer, scaler,
scheduler, data position, every RNG state) and DistributedDataParallel under torchrun.

Command line: ``qrnn-train`` (or ``python -m qrnn.train``) trains a QRNN language model
(:mod:`qrnn.train.lm`) on a text corpus (:mod:`qrnn.train.data`); with no arguments on the
reference text that ships with Python. ``qrnn-generate`` samples from a saved model.
``torchrun --nproc_per_node=N -m qrnn.train ...`` trains on N processes.

A Trainer is set by a few configs, each defined beside the component that uses it:
:class:`PrecisionConfig`, :class:`CheckpointConfig`, :class:`ScheduleConfig`,
:class:`BPTTConfig`, :class:`StopConfig`; ``qrnn-train``'s :class:`Settings` composes them
(and the data, model and optimizer configs of :mod:`qrnn.train.data`, :mod:`qrnn.train.lm`
and :mod:`qrnn.train.optim`) from its flags.

Modules: ``trainer`` (the loop), ``precision``, ``distributed`` (process group, collectives),
``state`` (carried and RNG state in checkpoints), ``checkpoints`` (saving with a stall meter,
best.pt, reading back), ``stopping`` (SIGTERM/SIGUSR1 as stop requests), ``errors``,
``records`` (the epoch record), ``lm``, ``data``; the command line: ``settings``
(``qrnn-train``'s flags, defined once), ``cli`` (``qrnn-train``), ``runs`` (the run folder),
``setup`` (building a run), ``report`` (metrics, plot, the lines printed), ``generate``
(``qrnn-generate``).
"""

from .checkpoints import CheckpointConfig, load_checkpoint
from .cli import main
from .distributed import Distributed, init_distributed
from .errors import TrainError, TrainingStopped
from .generate import generate_main
from .optim import ScheduleConfig
from .precision import PrecisionConfig, choose_precision
from .records import EpochRecord
from .settings import Settings
from .state import BPTTConfig, seed_everything
from .stopping import StopConfig
from .trainer import Trainer, fit

__all__ = ["Trainer", "fit", "PrecisionConfig", "CheckpointConfig", "ScheduleConfig", "BPTTConfig", "StopConfig",
           "choose_precision", "Distributed", "init_distributed", "TrainError", "TrainingStopped", "load_checkpoint",
           "seed_everything", "main", "generate_main", "Settings", "EpochRecord"]
