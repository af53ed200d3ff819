"""The work handle the neuron process group returns for every collective.

It wraps gloo's work on the host views and adds what gloo's lacks here: the result is the caller's
neuron tensors (not the views), post-processing that gloo cannot do (integer averages, dtype
staging) runs once when the collective completes, the tensors stay alive until then, and errors
are rewritten to name the collective, its sequence number and the ranks that did not arrive.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

from neuron_dist._modes import IssuerModes

__all__ = ["NeuronWork"]


class NeuronWork(dist.Work):
    """Completion handle of one collective (gloo works underneath, possibly several or none)."""

    def __init__(
        self,
        works: list[dist.Work],
        result: Any,
        *,
        finish: Callable[[], None] | None = None,
        diagnose: Callable[[BaseException], BaseException] | None = None,
        keep: Any = None,
    ) -> None:
        super().__init__()
        self._works = works
        self._result = result
        self._finish = finish
        self._diagnose = diagnose
        self._keep = keep  # the neuron tensors the host views alias, alive until completion
        self._modes = IssuerModes()  # made by the collective's steps: in the issuing thread's modes
        self._lock = threading.Lock()
        self._done = False
        self._future: torch.futures.Future | None = None
        if not works:
            self._complete()

    def _complete(self) -> None:
        with self._lock:
            if self._done:
                return
            if self._finish is not None:
                self._modes.run(self._finish)
            self._done = True
            self._keep = None

    def add_finish(self, finish: Callable[[], None], restore: Callable[[Any], Any]) -> None:
        """Runs ``finish`` after the collective's own post-processing (now, if it completed) and
        replaces the result by ``restore(result)``. Only for the code that made this work, before
        it hands the work out."""
        self._result = restore(self._result)
        if self._done:
            self._modes.run(finish)
            return
        previous = self._finish

        def both() -> None:
            if previous is not None:
                previous()
            finish()

        self._finish = both

    def _raise(self, error: BaseException) -> None:
        if self._diagnose is None:
            raise error
        raise self._diagnose(error) from error

    def wait(self, timeout: timedelta | None = None) -> bool:
        """Blocks until the collective completed; raises a diagnosed error if it failed."""
        if not self._done:
            try:
                for work in self._works:
                    if timeout is None or timeout == timedelta(0):
                        work.wait()
                    else:
                        work.wait(timeout)
            except Exception as error:  # noqa: BLE001 (gloo raises plain RuntimeError)
                self._raise(error)
            self._complete()
        return True

    def get_future(self) -> torch.futures.Future:
        """A future completed with the collective's result (the caller's tensors)."""
        if self._future is None:
            if self._done:
                future: torch.futures.Future = torch.futures.Future()
                future.set_result(self._result)
                self._future = future
            else:

                def done(fut: torch.futures.Future) -> Any:
                    try:
                        for inner in fut.value():
                            inner.wait()
                    except Exception as error:  # noqa: BLE001
                        self._raise(error)
                    self._complete()
                    return self._result

                futures = [work.get_future() for work in self._works]
                self._future = torch.futures.collect_all(futures).then(done)
        return self._future

    def is_completed(self) -> bool:
        """Whether the collective finished (successfully or not)."""
        return self._done or all(work.is_completed() for work in self._works)

    def is_success(self) -> bool:
        """Whether the collective finished without error."""
        return all(work.is_success() for work in self._works)

    def exception(self) -> BaseException | None:
        """The transport's error, if the collective failed."""
        for work in self._works:
            if work.exception() is not None:
                return work.exception()
        return None

    def result(self) -> Any:
        """The collective's output tensors."""
        self.wait()
        return self._result

    def source_rank(self) -> int:
        """For a receive from any source: the rank the message came from."""
        return self._works[0]._source_rank()

    def _source_rank(self) -> int:
        return self.source_rank()

    def synchronize(self) -> None:
        """Same as :meth:`wait` (execution is synchronous on the emulated device)."""
        self.wait()
