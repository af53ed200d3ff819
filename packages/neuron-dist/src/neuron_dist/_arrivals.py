"""Which collective each rank of a group has reached, published to the group's store.

Gloo's own errors say that something timed out or that a connection closed, not who is missing.
Each rank records the sequence number of the last collective it entered; a single background
thread per process publishes changes to the group's store a few times a second (never on the
collective's path). When a collective fails, the failing rank reads the board to name the ranks
that did not arrive.
"""

from __future__ import annotations

import atexit
import threading
import time
import weakref

import torch.distributed as dist

__all__ = ["ArrivalBoard"]

_PUBLISH_INTERVAL = 0.2  # seconds between publications of a changed sequence number
_KEY = "neuron_arrivals/{rank}"


class ArrivalBoard:
    """Publishes this rank's latest collective of one group; reads the other ranks' on failure."""

    def __init__(self, store: dist.Store, rank: int, world_size: int) -> None:
        self._store = store
        self._rank = rank
        self._world_size = world_size
        self._entered = 0
        self._published = 0
        self._lock = threading.Lock()
        self._closed = False
        _Publisher.instance().add(self)

    def enter(self, seq: int) -> None:
        """Records that this rank entered collective number ``seq`` (cheap: no store access)."""
        self._entered = seq

    def publish(self) -> None:
        """Writes this rank's latest sequence number to the store if it changed."""
        with self._lock:
            seq = self._entered
            if seq == self._published or self._closed:
                return
            self._store.set(_KEY.format(rank=self._rank), str(seq))
            self._published = seq

    def missing(self, seq: int) -> list[int] | None:
        """Group ranks that had not entered collective ``seq``, or ``None`` if the store is unreachable."""
        try:
            self.publish()
            time.sleep(2.5 * _PUBLISH_INTERVAL)  # let the others' publishers catch up
            late = []
            for rank in range(self._world_size):
                if rank == self._rank:
                    continue
                key = _KEY.format(rank=rank)
                reached = int(self._store.get(key)) if self._store.check([key]) else 0
                if reached < seq:
                    late.append(rank)
            return late
        except Exception:  # the store lives in a rank that may be gone
            return None

    def close(self) -> None:
        """Stops publishing (the group was destroyed)."""
        self._closed = True


class _Publisher:
    """The one daemon thread that publishes every live board of the process."""

    _instance: _Publisher | None = None
    _instance_lock = threading.Lock()

    def __init__(self) -> None:
        self._boards: weakref.WeakSet[ArrivalBoard] = weakref.WeakSet()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="neuron-dist-arrivals", daemon=True)
        self._thread.start()

    @classmethod
    def instance(cls) -> _Publisher:
        with cls._instance_lock:
            if cls._instance is None or not cls._instance._thread.is_alive():
                cls._instance = cls()
            return cls._instance

    def add(self, board: ArrivalBoard) -> None:
        self._boards.add(board)

    @classmethod
    def stop(cls) -> None:
        """Stops and joins the thread; runs at exit, before the interpreter finalizes.

        Groups live until the process ends (torch's C++ ProcessGroup holds them), and so would
        their boards. A daemon thread that is inside a store call while the interpreter
        finalizes is ended by ``pthread_exit`` when it takes the GIL back; unwinding its C++
        frames then calls ``std::terminate`` and the process aborts after a finished run.
        """
        with cls._instance_lock:
            publisher = cls._instance
        if publisher is not None:
            publisher._stop.set()
            publisher._thread.join(timeout=5 * _PUBLISH_INTERVAL)

    def _run(self) -> None:
        while not self._stop.wait(_PUBLISH_INTERVAL):
            for board in list(self._boards):
                try:
                    board.publish()
                except Exception:  # a store that went away: the failing collective reports it
                    board.close()


atexit.register(_Publisher.stop)
