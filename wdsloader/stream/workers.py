"""Report the death of a DataLoader worker process one way: :class:`WorkerDiedError`.

Depending on timing, torch reports a killed worker as a ``RuntimeError`` (from its SIGCHLD
handler, which can fire anywhere in the main thread, even inside the training step, or from its
queue check) or as a raw ``ConnectionResetError``/``EOFError`` (the dead worker's batch was half
received). :class:`WorkerWatch` arms torch's SIGCHLD check only while the main thread waits in
``next()``, checks the workers before each ``next()``, and turns every one of those errors into
one :class:`WorkerDiedError` naming the worker, its pid, exit code or signal and the shard it
was reading.
"""

from __future__ import annotations

import signal
import weakref
from multiprocessing.connection import wait
from typing import TYPE_CHECKING, Any

from torch.utils.data._utils import signal_handling

from wdsloader.errors import WorkerDiedError
from wdsloader.stream.shm_batches import forget

if TYPE_CHECKING:
    from wdsloader.stream.dataset import ShardStreamDataset


# how long a connection error waits for the worker behind it to be seen dead
DEATH_WAIT_S = 5.0
_REWRAPPED = "in DataLoader worker process"  # torch's text for a worker's own exception


class WorkerWatch:
    """Watches the workers of one torch DataLoader iterator (none with ``num_workers=0``)."""

    def __init__(self, iterator: Any, dataset: ShardStreamDataset) -> None:
        self.iterator = iterator
        self.workers: list[Any] = list(getattr(iterator, "_workers", None) or ())
        self.pids = tuple(w.pid for w in self.workers)
        self.dataset = dataset
        if self.workers:  # the blocks their batches came in stay mapped as long as they run
            weakref.finalize(iterator, forget, self.pids).atexit = False
        if self.workers and getattr(iterator, "_worker_pids_set", False):
            # torch's SIGCHLD check is armed only inside next() (see :meth:`next`)
            signal_handling._remove_worker_pids(id(iterator))
            iterator._worker_pids_set = False

    def next(self) -> Any:
        """The iterator's next item; a dead worker raises :class:`WorkerDiedError`."""
        if not self.workers:
            return next(self.iterator)
        try:
            # armed here only: torch's handler raises wherever the main thread is
            signal_handling._set_worker_pids(id(self.iterator), self.pids)
            try:
                if self._dead():  # died before: its SIGCHLD found nothing armed
                    raise RuntimeError("a DataLoader worker exited")
                return next(self.iterator)
            finally:
                signal_handling._remove_worker_pids(id(self.iterator))
        except (RuntimeError, ConnectionError, EOFError) as exc:
            died = self.died(exc)
            if died is None:
                raise
            raise died from exc

    def died(self, exc: BaseException) -> WorkerDiedError | None:
        """The error to raise for ``exc`` when a worker died, else None (re-raise ``exc``)."""
        if _REWRAPPED in str(exc):
            return None
        dead = self._dead()
        if not dead:  # a connection error may come a moment before the worker is reaped
            ready = wait([w.sentinel for w in self.workers], timeout=DEATH_WAIT_S)
            for w in self.workers:
                if w.sentinel in ready:  # its descriptors are closed: it is exiting
                    w.join(timeout=DEATH_WAIT_S)
            dead = self._dead()
        if not dead:
            return None
        error = WorkerDiedError("; ".join(self._describe(i) for i in dead) + _ADVICE)
        self._stop()
        return error

    def _stop(self) -> None:
        """End the other workers now: the iteration cannot go on, and a survivor may wait
        forever on a queue lock the dead worker held (torch would wait 5 s, then kill it)."""
        for w in self.workers:
            if w.exitcode is None:
                w.terminate()
        for w in self.workers:
            w.join(timeout=DEATH_WAIT_S)
        shutdown = getattr(self.iterator, "_shutdown_workers", None)
        if shutdown is not None:
            shutdown()

    def _dead(self) -> list[int]:
        """The workers that exited while torch still expected batches from them (torch stops
        an exhausted worker: exit code 0, no longer active)."""
        active = getattr(self.iterator, "_workers_status", None) or [True] * len(self.workers)
        return [
            i
            for i, w in enumerate(self.workers)
            if w.exitcode is not None and (w.exitcode != 0 or active[i])
        ]

    def _describe(self, worker: int) -> str:
        proc = self.workers[worker]
        ds = self.dataset
        code = proc.exitcode
        if code is None:
            how = "exit status unknown"
        elif code < 0:
            try:
                how = f"killed by signal {signal.Signals(-code).name}"
            except ValueError:
                how = f"killed by signal {-code}"
        else:
            how = f"exit code {code}"
        text = f"DataLoader worker {worker} (pid {proc.pid}) of rank {ds.rank} died ({how})"
        shard = ds.control.reading(worker)
        if shard is not None:
            text += f" while reading {ds.shards[shard].path}"
        return text


_ADVICE = (
    ". The iteration cannot go on; to continue after the last batch yielded, call "
    "loader.load_state_dict(loader.state_dict()) and iterate again"
)
