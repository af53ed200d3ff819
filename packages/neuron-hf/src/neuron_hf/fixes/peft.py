"""PEFT 0.21 on neuron: the device adapters are loaded to, and frozen adapter parameters moved to it."""

from __future__ import annotations

from collections.abc import Callable
from types import ModuleType
from typing import Any

from neuron_hf._device import on_neuron
from neuron_hf._fix import Fix, replace_function

__all__ = ["FIXES"]


def _make_infer_device(original: Callable[[], str]) -> Callable[[], str]:
    def infer_device() -> str:
        device = original()
        if device == "cpu" and on_neuron():
            return "neuron"
        return device

    return infer_device


def _patch_infer_device(module: ModuleType) -> None:
    # Upstream: infer_device checks cuda/mps/mlu/xpu/npu and otherwise answers "cpu", so on neuron
    # PeftModel.load_adapter / load_peft_weights / hotswap read adapter weights to the CPU first.
    # peft_model, save_and_load, hotswap, lorafa, xlora and monteclora import it by name.
    replace_function(module, "infer_device", _make_infer_device, rebind=("peft",))


def _frozen_adapter_parameters(layer: Any, adapter_name: str) -> list[str]:
    """Names of ``layer``'s ParameterDicts whose entry for ``adapter_name`` is frozen."""
    import torch.nn as nn

    frozen = []
    for name in (*layer.adapter_layer_names, *layer.other_param_names):
        held = getattr(layer, name, None)
        if isinstance(held, nn.ParameterDict) and adapter_name in held and not held[adapter_name].requires_grad:
            frozen.append(name)
    return frozen


def _make_move_adapter(original: Callable[..., None]) -> Callable[..., None]:
    def _move_adapter_to_device_of_base_layer(self: Any, adapter_name: str, device: Any = None) -> None:
        frozen = _frozen_adapter_parameters(self, adapter_name) if on_neuron() else []
        original(self, adapter_name, device)
        for name in frozen:
            getattr(self, name)[adapter_name].requires_grad_(False)

    return _move_adapter_to_device_of_base_layer


def _patch_move_adapter(module: ModuleType) -> None:
    # Upstream: the move stores ``item.to(device, dtype)`` back into its ParameterDict. Across
    # devices ``.to`` returns a plain tensor, which ParameterDict wraps in a new Parameter with
    # requires_grad=True, so a frozen adapter parameter becomes trainable: AdaLoRA's ``ranknum``
    # (its scaling's denominator) was trained on neuron and went to about -1.9e7 in PEFT's own
    # tests. On the CPU ``.to`` returns the same Parameter and nothing changes.
    replace_function(module.BaseTunerLayer, "_move_adapter_to_device_of_base_layer", _make_move_adapter)


FIXES = [
    Fix(
        name="peft.infer_device",
        module="peft.utils.other",
        distribution="peft",
        versions="~=0.21.2",
        corrects="infer_device answers 'cpu' on neuron",
        apply=_patch_infer_device,
    ),
    Fix(
        name="peft.BaseTunerLayer._move_adapter_to_device_of_base_layer",
        module="peft.tuners.tuners_utils",
        distribution="peft",
        versions="~=0.21.2",
        corrects="frozen adapter parameters (AdaLoRA's ranknum) become trainable when moved to neuron",
        apply=_patch_move_adapter,
    ),
]
