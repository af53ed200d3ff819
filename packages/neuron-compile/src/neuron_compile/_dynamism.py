"""What Dynamo may turn symbolic for the neuron backend: Python ints, never tensor sizes.

Trainium graphs have static shapes, so a new tensor shape is a new graph: loading the backend
keeps Dynamo's automatic dynamic shapes from making tensor sizes (and floats) symbolic. Python
ints keep torch.compile's default instead. An int that changes between calls (a step counter,
the length a sliding-window KV cache keeps in a Python int) becomes a ``SymInt`` graph input
after its first change, rather than a new Dynamo trace for every value. The backend compiles
an int that only feeds computations as a run-time argument of one executable, and specialises
an int that sizes a tensor (one executable per value, like any shape). ``dynamic=False`` still
specialises ints, as it does on every backend.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import torch._dynamo

__all__ = ["IntsSpecialised", "install"]

_installed = False


class IntsSpecialised(Exception):
    """The lowering guarded on a run-time int's value: the graph needs one executable per value."""


def _static(function: Callable[..., Any]) -> Callable[..., Any]:
    """``function`` run with Dynamo's automatic dynamic shapes off."""

    @functools.wraps(function)
    def run(*args: Any, **kwargs: Any) -> Any:
        with torch._dynamo.config.patch(automatic_dynamic_shapes=False):
            return function(*args, **kwargs)

    return run


def install() -> None:
    """Applies the policy for the process (idempotent)."""
    global _installed
    if _installed:
        return
    _installed = True
    try:
        from torch._dynamo.variables import builder

        tensor_sizes = builder._automatic_dynamic
        floats = builder.VariableBuilder.wrap_symfloat
    except (ImportError, AttributeError):  # another torch: everything static, ints included
        torch._dynamo.config.automatic_dynamic_shapes = False
        return
    builder._automatic_dynamic = _static(tensor_sizes)
    builder.VariableBuilder.wrap_symfloat = _static(floats)
