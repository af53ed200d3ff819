"""The modes a collective's own steps run in, on whichever thread runs them.

A collective's steps and its completion may run on the progress thread, on gloo's thread or
in a future's callback, not on the caller's. gloo's own works carry the issuing thread's state
to their worker threads; ours must too: a collective issued under ``torch.inference_mode()``
writes into inference tensors, which only code running in inference mode may update in place.
And collectives are not differentiable: gloo writes their results in C++, outside autograd, so
a tensor that requires grad (DDP's buckets under ``backward(create_graph=True)``) is a valid
argument; our steps write with ``out=`` and ``copy_``, so they run with grad mode off.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

import torch

__all__ = ["IssuerModes"]

T = TypeVar("T")


class IssuerModes:
    """Inference mode as it was where this object was made, and grad mode off."""

    __slots__ = ("_inference",)

    def __init__(self) -> None:
        self._inference = torch.is_inference_mode_enabled()

    def run(self, fn: Callable[..., T], *args: Any) -> T:
        """``fn(*args)`` in the issuer's inference mode, without grad (directly when this thread
        is already in those modes)."""
        if self._inference == torch.is_inference_mode_enabled():
            if not torch.is_grad_enabled():
                return fn(*args)
            with torch.no_grad():
                return fn(*args)
        with torch.inference_mode(self._inference), torch.no_grad():
            return fn(*args)
