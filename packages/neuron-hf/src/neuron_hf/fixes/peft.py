"""PEFT 0.21 on neuron: the device adapters are loaded to."""

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


FIXES = [
    Fix(
        name="peft.infer_device",
        module="peft.utils.other",
        distribution="peft",
        versions="~=0.21.2",
        corrects="infer_device answers 'cpu' on neuron",
        apply=_patch_infer_device,
    ),
]
