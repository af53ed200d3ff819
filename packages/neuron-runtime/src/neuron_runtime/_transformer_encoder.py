"""``nn.TransformerEncoder``'s nested-tensor fast path on neuron, run on dense tensors.

In eval mode with a padding mask, ``TransformerEncoder.forward`` packs its input into a
strided nested tensor on its fast-path devices (CPU, CUDA, XPU and the PrivateUse1 device),
runs the layers on it, and pads the result back with zeros. Strided nested tensors are not
supported on neuron. Here the encoder runs on the dense input instead, with the padding mask
passed to every layer; padded positions are then zeroed before the final norm, which is what
the nested path returns: the outputs equal the CPU's (padded positions included) within
floating-point rounding.

Both replacements stay invisible to TorchScript, which compiles the originals: scripting an
encoder (on any device) keeps working, and a scripted encoder is torch's own code.
"""

from __future__ import annotations

import threading
import types
from typing import Any, Callable

import torch
from torch import nn

_state = threading.local()
_original_forward: Callable[..., torch.Tensor] | None = None
_original_from_mask: Callable[..., torch.Tensor] | None = None


class _DensePathNeeded(Exception):
    """Raised inside a probing forward when the encoder is about to pack a neuron tensor."""


def _nested_tensor_from_mask(tensor: torch.Tensor, mask: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
    assert _original_from_mask is not None
    if getattr(_state, "probing", False) and tensor.device.type == "neuron":
        raise _DensePathNeeded
    return _original_from_mask(tensor, mask, *args, **kwargs)


def _padding_positions(encoder: nn.TransformerEncoder, src: torch.Tensor, padding_mask: torch.Tensor) -> torch.Tensor:
    """True where the nested path would have returned padding, in ``src``'s layout."""
    padded = padding_mask if padding_mask.dtype == torch.bool else padding_mask != 0
    if not encoder.layers[0].self_attn.batch_first:
        padded = padded.transpose(0, 1)
    return padded.unsqueeze(-1)


def _forward(self: nn.TransformerEncoder, src: torch.Tensor, mask: torch.Tensor | None = None,
             src_key_padding_mask: torch.Tensor | None = None, is_causal: bool | None = None) -> torch.Tensor:
    assert _original_forward is not None
    if src_key_padding_mask is None or src.device.type != "neuron" or torch.compiler.is_compiling():
        return _original_forward(self, src, mask, src_key_padding_mask, is_causal)
    _state.probing = True
    try:
        return _original_forward(self, src, mask, src_key_padding_mask, is_causal)
    except _DensePathNeeded:
        pass
    finally:
        _state.probing = False
    # The layers take the padding mask instead of a packed input; the norm comes after the zeroing.
    use_nested, norm = self.use_nested_tensor, self.norm
    self.use_nested_tensor, self.norm = False, None
    try:
        output = _original_forward(self, src, mask, src_key_padding_mask, is_causal)
    finally:
        self.use_nested_tensor, self.norm = use_nested, norm
    output = output.masked_fill(_padding_positions(self, src, src_key_padding_mask), 0.0)
    return output if norm is None else norm(output)


def install() -> None:
    """Patches nn.TransformerEncoder.forward and torch._nested_tensor_from_mask (idempotent)."""
    global _original_forward, _original_from_mask
    if _original_forward is not None:
        return
    _original_forward = nn.TransformerEncoder.forward
    _original_from_mask = torch._nested_tensor_from_mask
    torch._nested_tensor_from_mask = _nested_tensor_from_mask
    nn.TransformerEncoder.forward = _scripted_as(_forward, _original_forward)  # type: ignore[method-assign]
    # Scripted code calling torch._nested_tensor_from_mask calls the ATen operator, as before.
    torch.jit._builtins._register_builtin(_nested_tensor_from_mask, "aten::_nested_tensor_from_mask")


def _scripted_as(replacement: Callable[..., Any], original: Callable[..., Any]) -> Callable[..., Any]:
    """``replacement``, which TorchScript compiles as ``original``.

    TorchScript reads a method's source through ``inspect`` (which follows ``__wrapped__``) and
    resolves the names in it from the function's globals. The returned function runs
    ``replacement``'s code and keeps its names reachable through ``original``'s globals, where
    the original source finds everything it uses.
    """
    names = dict(replacement.__globals__)
    names.update(original.__globals__)
    clone = types.FunctionType(replacement.__code__, names, replacement.__name__,
                               replacement.__defaults__, replacement.__closure__)
    clone.__wrapped__ = original  # type: ignore[attr-defined]
    clone.__doc__ = original.__doc__
    return clone
