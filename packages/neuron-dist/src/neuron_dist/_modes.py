"""The autograd modes of the thread that issued a collective, for the parts that run on another.

A collective's steps and its completion may run on the progress thread, on gloo's thread or
in a future's callback, not on the caller's. gloo's own works carry the issuing thread's state
to their worker threads; ours must too: a collective issued under ``torch.inference_mode()``
writes into inference tensors, which only code running in inference mode may update in place
(and one issued under ``torch.no_grad()`` may write into leaves that require grad).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

import torch

__all__ = ["IssuerModes"]

T = TypeVar("T")


class IssuerModes:
    """Inference and grad mode as they were where this object was made."""

    __slots__ = ("_grad", "_inference")

    def __init__(self) -> None:
        self._inference = torch.is_inference_mode_enabled()
        self._grad = torch.is_grad_enabled()

    def run(self, fn: Callable[..., T], *args: Any) -> T:
        """``fn(*args)`` under the captured modes (directly when this thread is already in them)."""
        if self._inference == torch.is_inference_mode_enabled() and self._grad == torch.is_grad_enabled():
            return fn(*args)
        with torch.inference_mode(self._inference), torch.set_grad_enabled(self._grad):
            return fn(*args)
