"""Printing neuron tensors without tripping the float64 policy.

``torch._tensor_str`` formats every non-MPS tensor through float64 on its own device. That
is an artefact of printing, not user computation, so the float64 policy (warn/count or
error) is suspended on this thread while a neuron tensor is formatted.
"""

from __future__ import annotations

import functools
from typing import Any

import torch
import torch._tensor_str

from neuron_runtime import _C


def install() -> None:
    """Wraps torch._tensor_str._str (what Tensor.__repr__ calls) once."""
    original = torch._tensor_str._str
    if getattr(original, "_neuron_wrapped", False):
        return

    @functools.wraps(original)
    def _str(self: torch.Tensor, *args: Any, **kwargs: Any) -> str:
        if self.device.type != "neuron":
            return original(self, *args, **kwargs)
        previous = _C._set_float64_exempt(True)
        try:
            return original(self, *args, **kwargs)
        finally:
            _C._set_float64_exempt(previous)

    _str._neuron_wrapped = True  # type: ignore[attr-defined]
    torch._tensor_str._str = _str
