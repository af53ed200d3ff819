"""TRL 1.16 on neuron: the device map its trainers load models with."""

from __future__ import annotations

from collections.abc import Callable
from types import ModuleType
from typing import Any

from neuron_hf._device import on_neuron
from neuron_hf._fix import Fix, replace_function

__all__ = ["FIXES"]

# from_pretrained arguments that make transformers distribute the model itself (TP/FSDP/PP/EP);
# transformers refuses them together with any device_map.
_DISTRIBUTING_KWARGS = ("distributed_config", "tp_plan", "tp_size")


def _neuron_device_map(kwargs: dict[str, Any]) -> tuple[bool, Any]:
    """(whether to set it, the device map) for a model TRL loads on neuron."""
    from accelerate.state import PartialState
    from accelerate.utils import DistributedType

    state = PartialState()
    if state.device.type != "neuron":
        return False, None
    if state.distributed_type == DistributedType.MULTI_NEURON or any(k in kwargs for k in _DISTRIBUTING_KWARGS):
        return True, None
    return True, {"": state.device}


def _make_create_model_from_path(original: Callable[..., Any]) -> Callable[..., Any]:
    def create_model_from_path(model_id: str, architecture: Any = None, **kwargs: Any) -> Any:
        if "device_map" not in kwargs and on_neuron():
            needed, device_map = _neuron_device_map(kwargs)
            if needed:
                kwargs["device_map"] = device_map
        return original(model_id, architecture, **kwargs)

    return create_model_from_path


def _patch_create_model_from_path(module: ModuleType) -> None:
    # Upstream: create_model_from_path adds device_map="auto" on every device but cpu/mps, and the
    # trainers clear it only for MULTI_GPU/DEEPSPEED. On neuron that (a) makes from_pretrained
    # raise "Tensor parallelism and `device_map` are mutually exclusive" when
    # model_init_kwargs has a distributed_config, (b) gives each rank of a MULTI_NEURON run an
    # "auto" map instead of letting accelerate place the model, and (c) on one process spreads
    # the model over all cores. No map under MULTI_NEURON or with a distributed_config; the
    # process's own core otherwise. SFT/DPO/GRPO/KTO/RLOO/reward/distillation and experimental
    # trainers import the function by name: every binding under trl is replaced.
    replace_function(module, "create_model_from_path", _make_create_model_from_path, rebind=("trl",))


FIXES = [
    Fix(
        name="trl.create_model_from_path",
        module="trl.trainer.utils",
        distribution="trl",
        versions="~=1.16.0",
        corrects="device_map='auto' forced on neuron, even under MULTI_NEURON or with a distributed_config",
        apply=_patch_create_model_from_path,
    ),
]
