"""Contiguous stand-ins for strided tensors, in the collectives whose gloo implementation takes them.

gloo moves a tensor's memory as one block, yet some of its collectives copy their tensors
through flat buffers and so take any layout: the inputs of all_gather, gather, all_to_all and
reduce_scatter, and the outputs of all_gather, gather, all_to_all, all_gather_into_tensor and
reduce_scatter_tensor (a column of a matrix, say). The neuron backend takes the same ones: a
strided tensor there is replaced by a contiguous copy when the collective is issued (inputs:
the values of that moment, as gloo's copy), and a contiguous output is copied back into the
caller's tensor when the collective completes. Everywhere else a strided tensor is refused, as
gloo and NCCL refuse it or (gloo's all_reduce, broadcast, reduce, scatter) silently produce
wrong values.
"""

from __future__ import annotations

from typing import Any

import torch

from neuron_dist._errors import CollectiveArgumentError
from neuron_dist._host import host_view

__all__ = ["Staging", "any_strided"]


class Staging:
    """The stand-ins of one collective: made at issue, copied back into the caller's outputs at
    completion."""

    def __init__(self, op: str) -> None:
        self._op = op
        self._written: list[tuple[torch.Tensor, torch.Tensor]] = []  # (caller's tensor, stand-in)

    def __bool__(self) -> bool:
        return bool(self._written)

    def read(self, value: Any) -> Any:
        """``value`` (a tensor, or a list or list of lists of them) with each strided tensor
        replaced by a contiguous copy of its current values."""
        return _map(value, lambda t: t.contiguous())

    def written(self, value: Any) -> Any:
        """``value`` with each strided tensor replaced by a contiguous tensor of its shape, whose
        values :meth:`copy_back` writes into it."""
        return _map(value, self._stand_in)

    def copy_back(self) -> None:
        """Copies each stand-in's values into the caller's tensor (on the host: any thread)."""
        for tensor, stand_in in self._written:
            host_view(tensor).copy_(host_view(stand_in))

    def restore(self, result: Any) -> Any:
        """``result`` with the stand-ins replaced by the caller's tensors."""
        callers = {id(stand_in): tensor for tensor, stand_in in self._written}
        return _map(result, lambda t: callers.get(id(t), t), only_strided=False)

    def _stand_in(self, tensor: torch.Tensor) -> torch.Tensor:
        if torch._debug_has_internal_overlap(tensor) == 1:  # 1: elements share memory (an expand)
            raise CollectiveArgumentError(
                f"neuron: {self._op} got an output tensor whose elements overlap in memory (shape "
                f"{list(tensor.shape)}, strides {list(tensor.stride())}): a collective cannot write "
                f"one value into each of them. Pass a tensor that owns its memory, e.g. tensor.clone()."
            )
        with torch.inference_mode(False):  # copied back into the caller's tensor, never read as one
            stand_in = torch.empty(tensor.shape, dtype=tensor.dtype, device=tensor.device)
        self._written.append((tensor, stand_in))
        return stand_in


def any_strided(value: Any) -> bool:
    """Whether ``value`` (a tensor, or a list or list of lists of them) holds a strided tensor:
    the cheap test that keeps the common, all-contiguous call free of staging."""
    if isinstance(value, torch.Tensor):
        return not value.is_contiguous()
    if isinstance(value, list):
        return any(any_strided(v) for v in value)
    return False


def _map(value: Any, replace: Any, *, only_strided: bool = True) -> Any:
    if isinstance(value, torch.Tensor):
        return replace(value) if not only_strided or not value.is_contiguous() else value
    if isinstance(value, list):
        return [_map(v, replace, only_strided=only_strided) for v in value]
    return value
