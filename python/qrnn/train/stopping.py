"""Stop requests from a scheduler: SIGTERM (SLURM, Kubernetes, torchrun's agent) and SIGUSR1
(SLURM's ``--signal``) ask a run to stop, not kill it; so does Ctrl-C (SIGINT) where it is
caught too (qrnn-train does). While caught, the first such signal is recorded for the
training loop to act on at the next step, and from its arrival the process has `grace`
seconds left while the signals are caught: when they run out it ends with status 128 + the
signal number. A second Ctrl-C ends it at once, with status 130.

Installing handlers is also what makes a trainer that runs as PID 1 of a container react to
SIGTERM at all: PID 1 gets no default action for a signal it has no handler for."""

from __future__ import annotations

import contextlib
import os
import select
import signal
import sys
import threading
from dataclasses import dataclass
from typing import Iterator, Optional, Sequence

__all__ = ["StopConfig", "StopRequest", "catch_stop_signals", "with_ctrl_c", "STOP_SIGNALS", "DEFAULT_STOP_GRACE"]

STOP_SIGNALS = (signal.SIGTERM, signal.SIGUSR1)
# Well inside the 30 s that SLURM (KillWait), Kubernetes (terminationGracePeriodSeconds) and
# torchrun's agent leave between SIGTERM and SIGKILL.
DEFAULT_STOP_GRACE = 20.0


@dataclass(frozen=True)
class StopConfig:
    """How :meth:`qrnn.train.Trainer.fit` stops on request (``qrnn-train``'s ``--stop-grace``).

    Args:
        signals: the signals caught during fit() (main thread only) as a stop request
            (default SIGTERM and SIGUSR1): all ranks stop before the same step, the save in
            flight commits, the position reached is checkpointed (no validation), best.pt is
            promoted, and fit() raises :class:`qrnn.train.TrainingStopped` (a SystemExit,
            code 128 + the signal).
        grace: seconds from a stop signal until fit() must have returned; past them the
            process exits with that code at once (the last committed checkpoint stands).
    """

    signals: Sequence[int] = STOP_SIGNALS
    grace: float = DEFAULT_STOP_GRACE

    def __post_init__(self):
        object.__setattr__(self, "signals", tuple(self.signals))


def with_ctrl_c(signals: Sequence[int] = STOP_SIGNALS) -> tuple:
    """`signals` and SIGINT (Ctrl-C), unless this process ignores SIGINT: a job a shell starts
    in the background ignores it by convention, and then keeps ignoring it."""
    if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
        return tuple(signals)
    return tuple(signals) + (signal.SIGINT,)


class StopRequest:
    """The first stop signal caught (`signum`, 0 for none) and the grace timer it started."""

    def __init__(self, signals: Sequence[int] = STOP_SIGNALS, grace: float = DEFAULT_STOP_GRACE):
        self.signals = tuple(int(s) for s in signals)
        self.grace = grace
        self.signum = 0
        self.interrupts = 0  # SIGINTs delivered (counted by deliver())
        self._lock = threading.RLock()  # reentrant: the handler may interrupt the main thread in trip()
        self._timer: Optional[threading.Timer] = None

    @property
    def requested(self) -> bool:
        return self.signum != 0

    def trip(self, signum: int) -> None:
        """Record a stop request (the first one counts) and start the grace timer."""
        with self._lock:
            if self.signum:
                return
            self.signum = int(signum)
            self._timer = threading.Timer(self.grace, self._expire)
            self._timer.daemon = True
            self._timer.start()

    def deliver(self, signum: int) -> None:
        """One delivery of a caught signal (call it once per delivery): trip(), except that a
        second SIGINT ends the process at once. The first Ctrl-C asks for a stop that saves;
        a user who presses it again wants the process gone, not a wait for the save."""
        if signum == signal.SIGINT:
            with self._lock:
                self.interrupts += 1
                again = self.interrupts > 1
            if again:
                self._exit_now("SIGINT again: exiting now, without waiting for the stop", signal.SIGINT)
        self.trip(signum)

    def cancel_timer(self) -> None:
        """The stop is over and the caller takes control again: no forced exit."""
        with self._lock:
            if self._timer is not None:
                self._timer.cancel()

    def _expire(self) -> None:
        name = signal.Signals(self.signum).name
        self._exit_now(f"{name}: not stopped within the {self.grace:g} s grace; exiting now", self.signum)

    @staticmethod
    def _exit_now(what: str, signum: int) -> None:
        sys.stderr.write(f"qrnn-train: {what} (the last committed checkpoint stands"
                         + ("; continue with --resume)\n" if signum == signal.SIGINT else ")\n"))
        sys.stderr.flush()
        os._exit(128 + signum)  # no atexit: it would wait for the saves that overran


class _Installed:
    """The process's handlers and wake-up pipe, shared by nested catch_stop_signals()."""

    def __init__(self, request: StopRequest):
        self.request = request
        self.users = 0
        # The Python-level handler runs only when the main thread runs Python code; the wake-up
        # fd is written by the C-level handler at once, so a main thread blocked in a
        # collective or a wait still gets its grace timer.
        self.pipe: Optional[tuple] = None
        self.watcher: Optional[threading.Thread] = None
        read_end, write_end = os.pipe()
        os.set_blocking(write_end, False)
        previous_fd = signal.set_wakeup_fd(write_end, warn_on_full_buffer=False)
        if previous_fd != -1:  # someone else's (an event loop): leave it, the handler still works
            signal.set_wakeup_fd(previous_fd)
            os.close(read_end)
            os.close(write_end)
        else:
            self.pipe = (read_end, write_end)
            self.watcher = threading.Thread(target=self._watch, name="qrnn-stop-signals", daemon=True)
            self.watcher.start()
        # The handlers last, once it is settled who counts deliveries (see _handle).
        self.previous = {sig: signal.signal(sig, self._handle) for sig in request.signals}

    def _handle(self, signum, frame) -> None:
        # With the wake-up pipe the watcher counts deliveries (one byte each; this handler
        # runs once for several signals that arrive while the main thread is in C code) and
        # this handler only trips at once; without it, this handler is all there is.
        if self.pipe is None:
            self.request.deliver(signum)
        else:
            self.request.trip(signum)

    def _watch(self) -> None:
        assert self.pipe is not None
        read_end = self.pipe[0]
        while True:
            select.select([read_end], [], [])
            try:
                data = os.read(read_end, 64)
            except OSError:
                return
            if not data:  # the write end was closed: uninstalled
                return
            for signum in data:
                if signum in self.request.signals:
                    self.request.deliver(signum)

    def uninstall(self) -> None:
        self.request.cancel_timer()
        for sig, handler in self.previous.items():
            signal.signal(sig, handler)
        if self.pipe is not None:
            signal.set_wakeup_fd(-1)
            os.close(self.pipe[1])
            if self.watcher is not None:
                self.watcher.join()
            os.close(self.pipe[0])


_installed: Optional[_Installed] = None


@contextlib.contextmanager
def catch_stop_signals(signals: Sequence[int] = STOP_SIGNALS,
                       grace: float = DEFAULT_STOP_GRACE) -> Iterator[Optional[StopRequest]]:
    """Catch `signals` as stop requests for the duration (main thread only; elsewhere, or with
    no signals, yields None). Nested uses share the outermost request, its signals and grace."""
    global _installed
    if not signals or threading.current_thread() is not threading.main_thread():
        yield _installed.request if _installed is not None else None
        return
    if _installed is None:
        _installed = _Installed(StopRequest(signals, grace))
    installed = _installed
    installed.users += 1
    try:
        yield installed.request
    finally:
        installed.users -= 1
        if installed.users == 0:
            _installed = None
            installed.uninstall()
