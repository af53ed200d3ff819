"""accelerate 1.15 on neuron: per-core memory for device maps, single-core dispatch, a clear fp16 refusal."""

from __future__ import annotations

from collections.abc import Callable
from types import ModuleType
from typing import Any

import torch

from neuron_hf._device import on_neuron
from neuron_hf._fix import Fix, replace_function

__all__ = ["FIXES"]

_FP16_MARKER = "fp16 mixed precision requires a device in"


def _neuron_max_memory(max_memory: dict[int | str, int | str] | None) -> dict[int | str, int]:
    """accelerate's ``get_max_memory`` with the per-device branch every other accelerator has."""
    import psutil
    from accelerate.utils.modeling import convert_file_size_to_int, logger

    count = torch.neuron.device_count()
    if max_memory is None:
        memory: dict[int | str, int] = {i: torch.neuron.mem_get_info(i)[0] for i in range(count)}
        memory["cpu"] = psutil.virtual_memory().available
        return memory
    memory = {k: convert_file_size_to_int(v) if isinstance(v, str) else v for k, v in max_memory.items()}
    cores = sorted(k for k in memory if isinstance(k, int))
    for core in cores:
        if core >= count or core < 0:
            logger.warning(f"Device {core} is not available, available devices are {list(range(count))}")
    ordered = cores + [k for k in ("cpu", "disk") if k in memory]
    for key in memory:
        if key not in ordered:
            raise ValueError(
                f"Device {key!r} is not recognized, available devices are integers (neuron cores), 'cpu' and 'disk'"
            )
    return {k: memory[k] for k in ordered}


def _make_get_max_memory(original: Callable[..., Any]) -> Callable[..., Any]:
    def get_max_memory(max_memory: dict[int | str, int | str] | None = None) -> dict[int | str, int]:
        if not on_neuron():
            return original(max_memory)
        return _neuron_max_memory(max_memory)

    return get_max_memory


def _patch_get_max_memory(module: ModuleType) -> None:
    # Upstream: get_max_memory probes npu/mlu/sdaa/musa/xpu/hpu and otherwise CUDA; on neuron it
    # finds no device and returns only {"cpu": ...}, so device_map="auto"/"balanced"/"sequential"
    # put the whole model on the CPU. Also bound as accelerate.utils.get_max_memory and imported by
    # transformers.integrations.accelerate (both bind after this module loads, or are rebound).
    replace_function(module, "get_max_memory", _make_get_max_memory, rebind=("accelerate", "transformers"))


def _single_core(device_map: Any, force_hooks: bool) -> int | None:
    """The core index of a map that sends everything to one integer device (no hooks), else None."""
    if force_hooks or not isinstance(device_map, dict):
        return None
    devices = set(device_map.values())
    if len(devices) != 1:
        return None
    (device,) = devices
    return device if isinstance(device, int) and not isinstance(device, bool) else None


def _keep_tied_weights_alive(model: Any, device_map: Any) -> None:
    """Holds the host tensors of tied weights for as long as the model lives (disk offload only).

    Upstream keys its table of tied weights (``tied_params_map``) by the host address each tied
    weight has when the model is dispatched. Moving the weight to a core frees that host
    memory, and a disk-offloaded weight loaded later may land at the same address: its layer
    then gets the tied weight instead of its own (a shape error, or silently wrong results when
    the shapes agree). Neuron memory comes from the same host heap, so addresses are reused
    often. Keeping the original tensors referenced keeps their addresses unique, at the cost of
    one host copy of each tied weight.
    """
    if not isinstance(device_map, dict) or "disk" not in device_map.values():
        return
    from accelerate.utils import find_tied_parameters

    kept = []
    for group in find_tied_parameters(model):
        tensor = model.get_parameter(group[0])
        if tensor.device.type != "meta":
            kept.append(tensor.data)
    if kept:
        model._neuron_hf_tied_weights_kept = kept  # noqa: SLF001 (a private attribute of ours)


def _make_dispatch_model(original: Callable[..., Any]) -> Callable[..., Any]:
    def dispatch_model(model: Any, device_map: Any, *args: Any, force_hooks: bool = False, **kwargs: Any) -> Any:
        if on_neuron():
            _keep_tied_weights_alive(model, device_map)
        result = original(model, device_map, *args, force_hooks=force_hooks, **kwargs)
        core = _single_core(device_map, force_hooks) if on_neuron() else None
        if core is not None and getattr(model, "quantization_method", None) is None:
            model.to(f"neuron:{core}")
        return result

    return dispatch_model


def _patch_dispatch_model(module: ModuleType) -> None:
    # Upstream: for a map with a single integer device (e.g. {"": 0}, what "sequential"/"auto"
    # give for a model that fits one core) dispatch_model turns the index into "neuron:0" and
    # then never moves the model (`model.to` sits in the `else` of that if/elif chain): the model
    # silently stays on the CPU while hf_device_map says core 0. Imported by name in accelerate,
    # transformers.integrations and peft.
    replace_function(module, "dispatch_model", _make_dispatch_model, rebind=("accelerate", "transformers", "peft"))


def _make_accelerator_init(original: Callable[..., Any]) -> Callable[..., Any]:
    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        try:
            original(self, *args, **kwargs)
        except ValueError as err:
            if _FP16_MARKER in str(err) and "'neuron'" in str(err):
                raise ValueError(
                    "fp16 mixed precision is not supported on the neuron device (Trainium trains in bfloat16): "
                    "use bf16=True in TrainingArguments / SFTConfig, or mixed_precision='bf16' in Accelerator "
                    "(or `accelerate launch --mixed_precision bf16`)."
                ) from err
            raise

    return __init__


def _patch_fp16_message(module: ModuleType) -> None:
    # Upstream: Accelerator(mixed_precision="fp16") on neuron raises "fp16 mixed precision
    # requires a device in (...) (not 'neuron')", which does not say what to use instead.
    replace_function(module.Accelerator, "__init__", _make_accelerator_init)


def _make_is_fp16_available(original: Callable[[], bool]) -> Callable[[], bool]:
    def is_fp16_available() -> bool:
        return False if on_neuron() else original()

    return is_fp16_available


def _patch_is_fp16_available(module: ModuleType) -> None:
    # Upstream: is_fp16_available answers True on neuron, where Accelerator then refuses fp16
    # mixed precision, so `accelerate test` (its test_script's FP16 check) fails on neuron.
    replace_function(module, "is_fp16_available", _make_is_fp16_available, rebind=("accelerate",))


FIXES = [
    Fix(
        name="accelerate.is_fp16_available",
        module="accelerate.utils.imports",
        distribution="accelerate",
        versions="~=1.15.0",
        corrects="is_fp16_available is True on neuron, where fp16 is refused",
        apply=_patch_is_fp16_available,
    ),
    Fix(
        name="accelerate.get_max_memory",
        module="accelerate.utils.modeling",
        distribution="accelerate",
        versions="~=1.15.0",
        corrects="get_max_memory has no neuron branch: device_map='auto' lands on the CPU",
        apply=_patch_get_max_memory,
    ),
    Fix(
        name="accelerate.dispatch_model",
        module="accelerate.big_modeling",
        distribution="accelerate",
        versions="~=1.15.0",
        corrects="dispatch_model leaves the model on the CPU for a single-core integer map",
        apply=_patch_dispatch_model,
    ),
    Fix(
        name="accelerate.fp16_message",
        module="accelerate.accelerator",
        distribution="accelerate",
        versions="~=1.15.0",
        corrects="fp16 on neuron is refused without saying to use bf16",
        apply=_patch_fp16_message,
    ),
]
