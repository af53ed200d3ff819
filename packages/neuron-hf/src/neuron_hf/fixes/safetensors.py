"""safetensors 0.8 on neuron: loading a file straight to a neuron core."""

from __future__ import annotations

from collections.abc import Callable
from types import ModuleType
from typing import Any

import torch

from neuron_hf._device import on_neuron
from neuron_hf._fix import Fix, replace_function

__all__ = ["FIXES"]


def _as_index(device: Any) -> Any:
    """``"neuron"``/``"neuron:1"``/``torch.device("neuron", 1)`` as the core index safetensors accepts."""
    if isinstance(device, int | str | torch.device) and not isinstance(device, bool):
        try:
            parsed = torch.device(device)
        except (RuntimeError, TypeError):
            return device
        if parsed.type == "neuron":
            return parsed.index if parsed.index is not None else torch.neuron.current_device()
    return device


def _make_load_file(original: Callable[..., Any]) -> Callable[..., Any]:
    def load_file(filename: Any, device: Any = "cpu", *args: Any, **kwargs: Any) -> dict[str, torch.Tensor]:
        if on_neuron():
            device = _as_index(device)
        return original(filename, device, *args, **kwargs)

    return load_file


def _patch_load_file(module: ModuleType) -> None:
    # Upstream: safetensors' Rust device parser knows cpu/cuda/mps/npu/xpu/... and rejects
    # "neuron" ("device neuron is invalid"), so PEFT's load_peft_weights(device="neuron") and
    # PeftModel.from_pretrained(..., torch_device="neuron") fail. It accepts a bare core index,
    # which torch resolves against the current accelerator (neuron): give it that. PEFT and
    # transformers import load_file by name (as safe_load_file): every binding is replaced.
    replace_function(module, "load_file", _make_load_file, rebind=("safetensors", "peft", "transformers", "accelerate", "trl"))


FIXES = [
    Fix(
        name="safetensors.load_file",
        module="safetensors.torch",
        distribution="safetensors",
        versions="~=0.8.0",
        corrects="load_file(device='neuron') is refused ('device neuron is invalid')",
        apply=_patch_load_file,
    ),
]
