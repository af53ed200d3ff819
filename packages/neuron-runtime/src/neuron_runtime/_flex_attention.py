"""``torch.nn.attention.flex_attention`` on neuron tensors.

Flex attention checks its inputs against a fixed list of device types (CUDA, CPU, XPU, HPU,
MPS) and refuses any other, although its eager implementation is device-generic: it
materialises the score matrix, applies ``score_mod`` and the block mask's ``mask_mod`` with
vmap, and differentiates through ordinary ops. Neuron tensors are admitted to that eager path,
forward and backward, as CUDA tensors are. (Compiled flex attention is the compiler's business:
``neuron_compile`` lowers it to the same dense computation.)
"""

from __future__ import annotations

from typing import Any, Callable

_original_validate: Callable[..., None] | None = None


def _validate_device(query: Any, key: Any, value: Any) -> None:
    assert _original_validate is not None
    if query.device.type == "neuron":
        return
    _original_validate(query, key, value)


def install() -> None:
    """Admits neuron tensors to flex attention (idempotent; a torch without the check is left alone)."""
    global _original_validate
    try:
        from torch.nn.attention import flex_attention
    except ImportError:
        return
    current = getattr(flex_attention, "_validate_device", None)
    if current is None or current is _validate_device:
        return
    _original_validate = current
    flex_attention._validate_device = _validate_device
