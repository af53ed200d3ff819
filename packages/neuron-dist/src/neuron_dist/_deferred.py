"""Collectives that return before the other ranks have issued them (``async_op=True``).

A checked collective starts with an all-gather of signatures (:mod:`neuron_dist._frames`).
Waiting for it when the collective is issued would hold a rank until every rank has issued the
same collective, which gloo and NCCL do not do: a rank may issue an async all_reduce and then
send to a rank that receives before it joins the all_reduce, or issue async collectives on two
groups in the opposite order of another rank. So the process group writes each collective as
*steps*: a generator that posts the exchange, yields, and once resumed checks the signatures
and finishes or launches the data movement, returning its :class:`NeuronWork`.

:class:`DeferredCollective` resumes the steps exactly once, on whichever thread needs them
first: the caller's, in ``wait()`` (a synchronous collective resumes at once, on its own thread,
as before), or, when the caller goes on with other work, the progress thread, once the
exchange has completed. A group has one exchange in flight at a time (the next frame's size
follows the last exchange, and gloo needs every rank's calls in one order): a collective
issued before the previous one's steps ran is queued, and posted by the thread that finishes
them.
"""

from __future__ import annotations

import _thread
import atexit
import concurrent.futures
import os
import threading
import time
from collections.abc import Callable, Generator
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

from neuron_dist._modes import IssuerModes
from neuron_dist._work import NeuronWork

__all__ = ["DeferredCollective", "DeferredWork", "Steps"]

# What a collective's steps yield (the posted exchange) and return (the collective's work).
Steps = Generator[dist.Work, None, NeuronWork]

_POLL_SECONDS = 0.002  # how often the progress thread looks at exchanges nobody waits for
# ... backing off to this while it finds none (a loop of synchronous collectives never needs
# it, and each wake-up competes for the GIL with the caller)
_MAX_POLL_SECONDS = 0.05
_LINGER_SECONDS = 1.0  # how long it keeps looking after the last collective was issued, before it sleeps
_DELIVERY_THREADS = 8  # how deep future callbacks that wait on other collectives may nest


class _Latch:
    """A one-shot event, set at most once by one thread (cheaper to make than ``threading.Event``:
    every collective makes two)."""

    __slots__ = ("_is_set", "_lock")

    def __init__(self) -> None:
        self._is_set = False
        self._lock = _thread.allocate_lock()
        self._lock.acquire()  # held until set(): waiters block on it

    def set(self) -> None:
        self._is_set = True
        self._lock.release()

    def is_set(self) -> bool:
        return self._is_set

    def wait(self) -> None:
        if not self._is_set:
            with self._lock:  # acquired once set() released it; released again for other waiters
                pass


class DeferredCollective:
    """One issued collective; its steps run once, on any thread, after those of the group's
    previous collective.

    A group has one exchange in flight at a time (the next frame's size follows it, and gloo
    needs every rank's calls in one order), so a collective issued while the previous one's
    steps have not run is *queued*: its exchange is posted by whichever thread finishes the
    previous one's steps. Issuing never waits for other ranks.
    """

    def __init__(self, steps: Steps, group_alive: Callable[[], bool]) -> None:
        self._steps: Steps | None = steps
        self._modes = IssuerModes()  # the steps may run on another thread: in the issuer's modes
        self._exchange: dist.Work | None = None
        self._group_alive = group_alive  # False once the group is shut down
        self._lock = threading.Lock()
        self._claimed = False
        self._posted = _Latch()  # set once, by the thread that posts the exchange
        self._finished = _Latch()  # set once, in _finish
        self._previous: DeferredCollective | None = None  # set while queued behind it
        self._next: DeferredCollective | None = None
        self._on_finish: list[Callable[[], None]] = []
        self._prompt = False  # run the steps as soon as the exchange completes (a future is out)
        self._exchange_done = False  # set from gloo's thread when _prompt asked for it
        self._progress: _Progress | None = None  # watching this collective until its steps are claimed
        self.work: NeuronWork | None = None
        self.error: BaseException | None = None

    def start(self) -> dist.Work:
        """Runs the steps up to their exchange (raises StopIteration if they finished without one)."""
        return self._modes.run(next, self._steps)  # type: ignore[arg-type]

    def posted(self, exchange: dist.Work) -> None:
        """The steps ran up to their exchange on the issuing thread (nothing queued before them)."""
        with self._lock:
            self._exchange = exchange
            prompt = self._prompt
        self._posted.set()
        self._progress = watch(self)
        if prompt:
            self._run_on_exchange(exchange)

    def when_finished(self, callback: Callable[[], None]) -> None:
        """Calls ``callback`` once the steps have run (now, if they have)."""
        with self._lock:
            if not self._finished.is_set():
                self._on_finish.append(callback)
                return
        callback()

    def run_when_exchanged(self) -> None:
        """Has the progress thread run the steps as soon as the exchange completes (gloo's
        completion callback wakes it), instead of at its next look: someone holds a future."""
        with self._lock:
            if self._prompt:
                return
            self._prompt = True
            exchange = self._exchange
        if exchange is not None:
            self._run_on_exchange(exchange)

    def _run_on_exchange(self, exchange: dist.Work) -> None:
        # The callback runs on gloo's thread before gloo marks the work completed: the steps,
        # which wait for the work, run on the progress thread, woken now.
        def exchange_completed(_: torch.futures.Future) -> None:
            self._exchange_done = True
            _Progress.instance().kick()

        exchange.get_future().add_done_callback(exchange_completed)

    def queue_behind(self, previous: DeferredCollective) -> bool:
        """Queues this collective behind ``previous``; False if ``previous``'s steps already ran."""
        with previous._lock:  # _finish sets _finished and takes _next under it
            if previous._finished.is_set():
                return False
            previous._next = self
            self._previous = previous
            return True

    @property
    def claimed(self) -> bool:
        """Whether some thread has started (or finished) the steps after the exchange."""
        return self._claimed

    @property
    def finished(self) -> bool:
        """Whether the steps have run: :attr:`work` or :attr:`error` is set."""
        return self._finished.is_set()

    def exchanged(self) -> bool:
        """Whether the signature exchange completed (successfully or not), without waiting."""
        if self._exchange is None:
            return False
        return self._exchange_done or self._exchange.is_completed() or not self._group_alive()

    def run(self) -> None:
        """Runs the steps on this thread (and, first, those of the collectives queued before
        it), or waits until the thread that claimed them is done."""
        earlier = []
        previous = self._previous
        while previous is not None and not previous.finished:
            earlier.append(previous)
            previous = previous._previous
        for collective in reversed(earlier):
            collective.run()
        self._posted.wait()  # set by whoever finished the previous collective
        with self._lock:
            mine = not self._claimed
            self._claimed = True
        if not mine:
            self._finished.wait()
            return
        if self._progress is not None:
            self._progress.forget(self)
        steps, self._steps = self._steps, None
        try:
            self._modes.run(steps.send, None)  # type: ignore[union-attr]
        except StopIteration as done:
            self.work = done.value
        except BaseException as error:  # noqa: BLE001 (re-raised by result() on the caller's thread)
            self.error = error
        else:
            steps.close()  # type: ignore[union-attr]
            self.error = RuntimeError("neuron: internal error: a collective's steps yielded twice")
        finally:
            self._finish()

    def _finish(self) -> None:
        self._previous = None
        with self._lock:
            self._finished.set()
            queued, self._next = self._next, None
            callbacks, self._on_finish = self._on_finish, []
        for callback in callbacks:
            callback()
        if queued is not None:
            queued._post()

    def _post(self) -> None:
        """Runs a queued collective's steps up to their exchange (the previous one's are done)."""
        try:
            exchange = self.start()
        except StopIteration as done:  # finished without an exchange
            self.work = done.value
        except BaseException as error:  # noqa: BLE001 (a bad argument: raised by wait())
            self.error = error
        else:
            self.posted(exchange)
            return
        self._steps = None
        self._claimed = True
        self._posted.set()
        self._finish()

    def result(self) -> NeuronWork:
        """The collective's work, once its steps ran; raises the error they raised."""
        self.run()
        if self.error is not None:
            raise self.error
        assert self.work is not None
        return self.work


class DeferredWork(dist.Work):
    """The handle returned for a :class:`DeferredCollective`: each query runs the steps if needed."""

    def __init__(self, collective: DeferredCollective) -> None:
        super().__init__()
        self._collective = collective
        self._future: torch.futures.Future | None = None

    def wait(self, timeout: timedelta | None = None) -> bool:
        """Blocks until the collective completed; raises a diagnosed error if it failed."""
        return self._collective.result().wait(timeout)

    def is_completed(self) -> bool:
        """Whether the collective finished (successfully or not); never blocks."""
        collective = self._collective
        if not collective.finished:
            if not collective.exchanged():
                return False
            collective.run()
        return collective.error is not None or collective.work.is_completed()  # type: ignore[union-attr]

    def is_success(self) -> bool:
        """Whether the collective finished without error."""
        return self.is_completed() and self._collective.error is None and self._collective.work.is_success()  # type: ignore[union-attr]

    def exception(self) -> BaseException | None:
        """The collective's error, if it failed."""
        collective = self._collective
        if not collective.finished:
            return None
        return collective.error if collective.error is not None else collective.work.exception()  # type: ignore[union-attr]

    def get_future(self) -> torch.futures.Future:
        """A future completed with the collective's result; does not wait for the other ranks
        (the steps run as soon as the exchange completes, on whichever thread sees it first)."""
        if self._future is not None:
            return self._future
        collective = self._collective
        future: torch.futures.Future = torch.futures.Future()
        self._future = future

        def transfer(done: torch.futures.Future | None) -> None:  # None: the steps failed
            try:
                if done is None:
                    raise collective.error  # type: ignore[misc]
                future.set_result(done.value())
            except BaseException as error:  # noqa: BLE001 (delivered through the future)
                future.set_exception(error)

        def deliver() -> None:
            # The future's callbacks (user code: DDP's hooks chain .then()s, and PowerSGD's wait on
            # further collectives) run on a delivery thread, never on the thread that runs the
            # collectives' steps or on gloo's, which such a wait would otherwise block.
            if collective.error is not None:
                _deliveries().submit(transfer, None)
                return
            inner = collective.work.get_future()  # type: ignore[union-attr]
            inner.add_done_callback(lambda done: _deliveries().submit(transfer, done))

        collective.when_finished(deliver)
        collective.run_when_exchanged()
        return future

    def result(self) -> Any:
        """The collective's output tensors."""
        return self._collective.result().result()

    def source_rank(self) -> int:
        """Not a receive: collectives have no single source."""
        return self._collective.result().source_rank()

    def _source_rank(self) -> int:
        return self.source_rank()

    def synchronize(self) -> None:
        """Same as :meth:`wait` (execution is synchronous on the emulated device)."""
        self.wait()


class _Progress:
    """The daemon thread that runs the steps of collectives nobody waits for yet.

    It holds the collectives whose steps no thread has claimed (a caller's ``wait()`` claims
    them and takes them off), looks at them every few milliseconds while some are left, backs
    off while every look finds nothing left to do (a loop of synchronous collectives), and
    sleeps once no collective has been issued for a while.
    """

    _instance: _Progress | None = None
    _instance_lock = threading.Lock()

    def __init__(self) -> None:
        self._pending: dict[DeferredCollective, None] = {}  # insertion-ordered: the issue order
        self._wake = threading.Condition()
        self._idle = False
        self._kicked = False
        self._stop = False
        self._last_added = time.monotonic()
        self._thread = threading.Thread(target=self._run, name="neuron-dist-progress", daemon=True)
        self._thread.start()

    @classmethod
    def instance(cls) -> _Progress:
        with cls._instance_lock:
            if cls._instance is None or not cls._instance._thread.is_alive():
                cls._instance = cls()
            return cls._instance

    def add(self, collective: DeferredCollective) -> None:
        with self._wake:
            self._pending[collective] = None
            self._last_added = time.monotonic()
            if self._idle:
                self._wake.notify()

    def forget(self, collective: DeferredCollective) -> None:
        """``collective``'s steps were claimed by some thread: nothing left to watch."""
        with self._wake:
            self._pending.pop(collective, None)

    def kick(self) -> None:
        """Look now: an exchange somebody holds a future of has completed."""
        with self._wake:
            self._kicked = True
            self._wake.notify()

    @classmethod
    def stop(cls) -> None:
        """Stops and joins the thread at exit (see ``_arrivals._Publisher.stop`` for why)."""
        with cls._instance_lock:
            progress = cls._instance
        if progress is not None:
            progress.drain()
            with progress._wake:
                progress._stop = True
                progress._wake.notify()
            progress._thread.join(timeout=1.0)

    def drain(self) -> None:
        """Runs, on this thread, the steps of every collective nobody waited for (at exit: as
        gloo finishes its queued work before a process ends, other ranks may be waiting for
        their data). Waits for their exchanges, up to each group's timeout."""
        while True:
            with self._wake:
                pending = [collective for collective in self._pending if not collective.claimed]
            if not pending:
                return
            for collective in pending:  # running one posts the collective queued behind it
                if not collective.claimed:
                    collective.run()

    def _run(self) -> None:
        interval = _POLL_SECONDS
        while True:
            with self._wake:
                if not self._pending and time.monotonic() - self._last_added > _LINGER_SECONDS:
                    self._idle = True
                    while not self._pending and not self._stop:
                        self._wake.wait()
                    self._idle = False
                    interval = _POLL_SECONDS
                if self._stop:
                    return
                if not self._kicked:
                    self._wake.wait(interval)
                self._kicked = False
                pending = list(self._pending)
            busy = False
            for collective in pending:
                if collective.claimed:
                    continue
                busy = True  # issued and not waited for: look again soon
                if collective.exchanged():
                    collective.run()  # errors are kept for the caller's wait()
            interval = _POLL_SECONDS if busy else min(2 * interval, _MAX_POLL_SECONDS)


_delivery_pool: concurrent.futures.ThreadPoolExecutor | None = None
_delivery_lock = threading.Lock()


def _deliveries() -> concurrent.futures.ThreadPoolExecutor:
    """Threads that complete the futures handed out by ``get_future()`` (a few, so a callback
    that waits for another collective's future does not hold up that future's delivery)."""
    global _delivery_pool
    with _delivery_lock:
        if _delivery_pool is None:
            _delivery_pool = concurrent.futures.ThreadPoolExecutor(
                max_workers=_DELIVERY_THREADS, thread_name_prefix="neuron-dist-future"
            )
        return _delivery_pool


def watch(collective: DeferredCollective) -> _Progress:
    """Makes sure ``collective``'s steps run once its exchange completes, even if nobody waits."""
    progress = _Progress.instance()
    progress.add(collective)
    return progress


def _forget_after_fork() -> None:
    global _delivery_pool, _delivery_lock
    _Progress._instance = None  # the threads did not survive the fork
    _Progress._instance_lock = threading.Lock()
    _delivery_pool, _delivery_lock = None, threading.Lock()


atexit.register(_Progress.stop)
os.register_at_fork(after_in_child=_forget_after_fork)
