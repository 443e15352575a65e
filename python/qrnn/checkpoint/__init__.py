"""Non-blocking, crash-safe checkpoints that plain ``torch.load`` reads.

    ckpt = qrnn.checkpoint.AsyncCheckpointer("runs/ckpt", keep_last=3)
    for epoch in range(epochs):
        train_one_epoch(...)
        ckpt.save({"model": model.state_dict(), "optim": opt.state_dict(), "epoch": epoch}, step=epoch)
    ckpt.close()                                   # or `with AsyncCheckpointer(...) as ckpt:`
    state = qrnn.checkpoint.load(ckpt.latest())

What ``save(state, step)`` does on the calling thread: pickles the *structure* of ``state``
(dicts, lists, numbers, strings; tensors become references to their storages, exactly as
``torch.save`` writes them) and takes a snapshot of every tensor's bytes into a reusable
staging buffer allocated once (pinned when CUDA tensors are saved). CPU bytes are copied by
C++ threads with the GIL released; CUDA bytes are copied on a side stream, and the current
stream waits for that copy before running anything after ``save()``, so the host does not
wait at all. A C++ writer thread then computes CRCs and writes the file in torch.save's zip
layout to a temporary name in the same folder (locked while it writes), fsyncs it, renames it
over ``<directory>/ckpt-<step:012d>.pt``, fsyncs the folder, and deletes the checkpoints
committed before the ``keep_last`` most recent ones. A process killed at any moment never
leaves a partial file under a final name; the next writer into that folder removes its
temporary (only temporaries whose writer is gone: their lock is free, whatever process
namespace or host the writer ran in). Readers (``latest()``, ``checkpoints()``, ``load``)
never delete anything; :class:`CheckpointFolder` lists and loads a folder's checkpoints
without a writer (no threads, no lock), next to the folder's writer or without one.

Order: the commit order (each commit is stamped after every earlier checkpoint in the
folder, as its modification time), not the step: after a rollback to an earlier step the
new saves are the latest and are kept. ``latest(order="step")`` gives the highest step.

Snapshot semantics: the file holds the values at the moment ``save()`` was called, even if
training changes every tensor right after (CPU tensors such as Adam's ``step`` included).

Overlap mode, ``save(state, step, overlap_with=optimizer)``: ``save()`` returns right after
pickling the structure; the staging copy runs while the next forward and backward pass run,
and ``optimizer.step()`` waits for it (a one-shot step pre-hook). This is safe when nothing
else modifies a saved tensor in place before that ``optimizer.step()``: not the forward pass
(BatchNorm running statistics, in-place buffer updates, an EMA updated in forward), not
``load_state_dict``, not a manual ``param.data.copy_``. Save such state in default mode, or
call ``handle.wait_staged()`` before modifying it.

Any number of overlap saves, checkpointers and user hooks may share an optimizer.

Errors (full disk, file-size limit, read-only or vanished folder, a failure inside the
writer thread) raise :class:`CheckpointError` from the next ``save()``, ``wait()`` or
``close()`` (and from that save's ``handle.result()``); the previous checkpoint is untouched
and no temporary file is left. A ``save()`` that reports an earlier failure still makes its
own save first (its handle is ``error.next_handle``): one failure costs one checkpoint.
``max_pending`` bounds the snapshots held in memory: a further ``save()`` waits for the
oldest, or returns ``None`` at once with ``block=False``.

Shared folders: the folder is opened once and nothing after follows its name or a link in it;
one writer per folder and prefix (the first save takes ``.<prefix>writer.lock``; a second
writer gets a CheckpointError naming the holder); ``write_file``/``publish`` write the run
folder's other files (metrics, best.pt) by the same protocol. ``load`` checks the archive's
structure before unpickling, so an untrusted file cannot make it allocate much more than it
holds, and refuses a pickle that calls code in one line (:class:`UnsafeCheckpointError`).
A staging image that the memory cgroup cannot hold (or that cannot be allocated) makes
``save()`` write from the live tensors instead, blocking like torch.save.

``async_save(obj, path)`` is torch.save's asynchronous twin on the same machinery (one
writer per process for every call, two snapshots in flight at most); ``wait_all()`` waits
for them, and they are finished at exit like every checkpointer's.

Fork: in a child created by ``os.fork()`` a checkpointer inherited from the parent works
with fresh writer threads; the parent's saves stay the parent's (their handles raise
RuntimeError in the child), and nothing in the child waits for them.
"""

from .checkpointer import AsyncCheckpointer
from .errors import CheckpointError, CorruptCheckpointError, UnsafeCheckpointError
from .folder import CheckpointFolder
from .handle import SaveHandle
from .reader import load, verify
from .saver import async_save, wait_all

# The package by responsibility, one direction of imports:
#   saver -> checkpointer -> handle -> staging -> (qrnn._C);  checkpointer -> pickler;
#   checkpointer -> folder -> reader -> errors.
# lightning (QRNNCheckpointIO) -> saver is imported only by whoever asks for it.
__all__ = ["AsyncCheckpointer", "CheckpointFolder", "SaveHandle", "CheckpointError", "CorruptCheckpointError",
           "UnsafeCheckpointError", "load", "verify", "async_save", "wait_all"]
