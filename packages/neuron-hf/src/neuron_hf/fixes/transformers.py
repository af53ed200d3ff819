"""transformers 5.23 on neuron: generate()'s compile settings, offloaded KV caches, the Trainer's RNG
checkpoint and memory metrics, continuous batching's memory budget, and the device tables of its test
utilities."""

from __future__ import annotations

import gc
import os
import sys
from collections.abc import Callable
from types import ModuleType
from typing import Any

import torch

from neuron_hf._device import on_neuron
from neuron_hf._fix import Fix, replace_function

__all__ = ["FIXES"]

_KEY = "neuron"


def _rng_file(args: Any, directory: str) -> str:
    """The file the Trainer writes its RNG states to (the same rule as upstream)."""
    name = "rng_state.pth" if args.world_size <= 1 else f"rng_state_{args.process_index}.pth"
    return os.path.join(directory, name)


def _is_distributed(args: Any) -> bool:
    from transformers.training_args import ParallelMode

    return args.parallel_mode == ParallelMode.DISTRIBUTED


def _load_states(path: str) -> dict[str, Any]:
    from transformers.trainer_pt_utils import safe_globals

    with safe_globals():
        return torch.load(path, weights_only=True)


def _make_save(original: Callable[..., Any]) -> Callable[..., Any]:
    def _save_rng_state(self: Any, output_dir: str) -> None:
        original(self, output_dir)
        path = _rng_file(self.args, output_dir)
        if not on_neuron() or not os.path.isfile(path):
            return
        states = _load_states(path)
        if _is_distributed(self.args):
            states[_KEY] = torch.neuron.random.get_rng_state_all()
        else:
            states[_KEY] = torch.neuron.random.get_rng_state()
        torch.save(states, path)

    return _save_rng_state


def _make_load(original: Callable[..., Any]) -> Callable[..., Any]:
    def _load_rng_state(self: Any, checkpoint: str | None) -> None:
        original(self, checkpoint)
        if checkpoint is None or not on_neuron():
            return
        path = _rng_file(self.args, checkpoint)
        if not os.path.isfile(path):
            return  # upstream already logged that reproducibility is not guaranteed
        from transformers.trainer_pt_utils import set_rng_state_for_device

        states = _load_states(path)
        if _KEY in states:
            set_rng_state_for_device("NEURON", torch.neuron, states, _is_distributed(self.args))

    return _load_rng_state


def _patch_trainer_rng(module: ModuleType) -> None:
    # Upstream: Trainer._save_rng_state/_load_rng_state store python, numpy, CPU and the
    # cuda/xla/npu/hpu/mlu/musa generators, not neuron's; a resumed run restarts the neuron
    # generator from the seed, so its dropout masks (and its loss curve) differ from an
    # uninterrupted run. The neuron state is added to the same file under "neuron".
    replace_function(module.Trainer, "_save_rng_state", _make_save)
    replace_function(module.Trainer, "_load_rng_state", _make_load)


def _caller_stage(tracker: Any) -> str:
    """The stage of the Trainer method that called the tracker's method (upstream's derive_stage,
    one frame further out: it reads its caller's caller, which a wrapper would displace)."""
    caller = sys._getframe(2).f_code.co_name
    if caller not in tracker.stages:
        raise ValueError(f"was called from {caller}, but only expect to be called from one of {tracker.stages.keys()}")
    return tracker.stages[caller]


def _tracks_neuron(tracker: Any) -> bool:
    return getattr(tracker, "_neuron_memory", False) and not tracker.skip_memory_metrics


def _make_tracker_init(original: Callable[..., Any]) -> Callable[..., Any]:
    def __init__(self: Any, skip_memory_metrics: bool = False) -> None:
        original(self, skip_memory_metrics)
        # the host-side figures come from upstream's CPU path (self.torch None); neuron's are added
        self._neuron_memory = not self.skip_memory_metrics and self.torch is None and on_neuron()
        if self._neuron_memory:
            self.gpu = {}

    return __init__


def _make_tracker_start(original: Callable[..., Any]) -> Callable[..., Any]:
    def start(self: Any) -> None:
        if self.skip_memory_metrics:
            return original(self)
        stage = _caller_stage(self)
        # a nested evaluation during training is ignored, as upstream does
        if _tracks_neuron(self) and self.cur_stage in (None, stage):
            gc.collect()
            torch.neuron.reset_peak_memory_stats()
            torch.neuron.empty_cache()
            self.gpu_mem_used_at_start = torch.neuron.memory_allocated()
        self.derive_stage = lambda: stage
        try:
            original(self)
        finally:
            del self.derive_stage

    return start


def _make_tracker_stop(original: Callable[..., Any]) -> Callable[..., Any]:
    def stop(self: Any, stage: str) -> None:
        if not _tracks_neuron(self) or self.cur_stage is None or self.cur_stage != stage:
            return original(self, stage)
        current = self.cur_stage
        original(self, stage)  # host memory; collects garbage first
        torch.neuron.empty_cache()
        now, peak = torch.neuron.memory_allocated(), torch.neuron.max_memory_allocated()
        self.gpu[current] = {"begin": self.gpu_mem_used_at_start, "end": now,
                             "alloc": now - self.gpu_mem_used_at_start, "peaked": max(0, peak - now)}

    return stop


def _make_tracker_update(original: Callable[..., Any]) -> Callable[..., Any]:
    def update_metrics(self: Any, stage: str, metrics: dict[str, Any]) -> None:
        if not _tracks_neuron(self):
            return original(self, stage, metrics)
        self.torch = torch  # upstream reports self.gpu's figures when self.torch is set
        try:
            original(self, stage, metrics)
        finally:
            self.torch = None

    return update_metrics


def _patch_memory_tracker(module: ModuleType) -> None:
    # Upstream: TrainerMemoryTracker measures device memory for cuda, mlu, musa, xpu, npu, hpu
    # and mps only, so on neuron the Trainer's metrics have no *_mem_gpu_* entries (the device's
    # allocator is never read). On neuron they now come from torch.neuron's allocator
    # statistics, as upstream's CUDA branch reads torch.cuda's. Its stage detection reads the
    # caller's frame, which these wrappers displace by one: they pass the stage in.
    tracker = module.TrainerMemoryTracker
    replace_function(tracker, "__init__", _make_tracker_init)
    replace_function(tracker, "start", _make_tracker_start)
    replace_function(tracker, "stop", _make_tracker_stop)
    replace_function(tracker, "update_metrics", _make_tracker_update)


def _make_memory_breakdown(original: Callable[..., Any]) -> Callable[..., Any]:
    def get_device_and_memory_breakdown() -> tuple[torch.device, int, int, int]:
        if not on_neuron():
            return original()
        # The same figures as upstream's CUDA branch, from the current core's allocator.
        neuron = torch.neuron
        device = torch.device("neuron", neuron.current_device())
        neuron.empty_cache()
        neuron.synchronize()
        free, total = neuron.mem_get_info(device)
        # Emulated HBM is host RAM: budget no more than the host can still back, or the paged
        # cache (sized at ~90% of what is free) pages the machine, or gets the process killed.
        from neuron_runtime import _C

        used = total - free
        return device, min(total, used + _C._host_available_bytes()), neuron.memory_reserved(device), used

    return get_device_and_memory_breakdown


def _patch_continuous_batching_memory(module: ModuleType) -> None:
    # Upstream: get_device_and_memory_breakdown() has cuda, xpu and mps branches and otherwise
    # reports the host's RAM, so generate_batch() on a neuron model sizes its paged KV cache
    # from host memory (here: 22 GB on a 24 GiB core; on a Trainium host with far more RAM than
    # HBM, an OutOfMemoryError). On neuron it now reports the core's HBM, as the CUDA branch does.
    replace_function(module, "get_device_and_memory_breakdown", _make_memory_breakdown,
                     rebind=("transformers.generation.continuous_batching",))


# transformers.testing_utils' device-agnostic tables (backend_manual_seed, backend_device_count,
# backend_memory_allocated, ...) -> the torch.neuron function each entry calls.
_TESTING_TABLES = {
    "BACKEND_MANUAL_SEED": "manual_seed",
    "BACKEND_EMPTY_CACHE": "empty_cache",
    "BACKEND_DEVICE_COUNT": "device_count",
    "BACKEND_RESET_MAX_MEMORY_ALLOCATED": "reset_peak_memory_stats",
    "BACKEND_RESET_PEAK_MEMORY_STATS": "reset_peak_memory_stats",
    "BACKEND_MAX_MEMORY_ALLOCATED": "max_memory_allocated",
    "BACKEND_MEMORY_ALLOCATED": "memory_allocated",
    "BACKEND_SYNCHRONIZE": "synchronize",
}


def _register_testing_device(module: ModuleType) -> None:
    # Upstream: the tables have entries for cuda, xpu, npu, hpu, mlu, tpu and xla only; with
    # TRANSFORMERS_TEST_DEVICE=neuron every call falls to "default": device_count() is 1 (so
    # multi-device tests skip on a multi-core instance), memory_allocated() is 0 and
    # synchronize/empty_cache do nothing. Entries upstream already has are left alone.
    neuron = torch.neuron
    for table, function in _TESTING_TABLES.items():
        getattr(module, table).setdefault(_KEY, getattr(neuron, function))
    module.BACKEND_TORCH_ACCELERATOR_MODULE.setdefault(_KEY, neuron)


def _make_default_compile_config(original: Callable[..., Any]) -> Callable[..., Any]:
    def _default_compile_config(self: Any) -> Any:
        config = original(self)
        if getattr(self, "device", None) is not None and self.device.type == "neuron" and config.dynamic is False:
            config.dynamic = None  # static tensor shapes all the same: the neuron backend keeps them
        return config

    return _default_compile_config


def _patch_default_compile_config(module: ModuleType) -> None:
    # Upstream: generate() compiles neuron decoding with CompileConfig(backend="neuron",
    # dynamic=False) to get static shapes. dynamic=False also specialises every Python int, and
    # a sliding-window static cache (Mistral, Gemma 2/3, Qwen2) keeps its length in one, so
    # Dynamo traced the decoding step again for every new token (~1 s a token, and eager
    # decoding once Dynamo's recompile limit is reached). With dynamic=None the neuron backend
    # still keeps tensor shapes static, and that length becomes a run-time argument.
    replace_function(module.PreTrainedModel, "_default_compile_config", _make_default_compile_config)


def _make_offloading_update(original: Callable[..., Any]) -> Callable[..., Any]:
    def update(self: Any, key_states: torch.Tensor, value_states: torch.Tensor, layer_idx: int,
               *args: Any, **kwargs: Any) -> tuple[torch.Tensor, torch.Tensor]:
        if not (self.offloading and key_states.device.type == "neuron"):
            return original(self, key_states, value_states, layer_idx, *args, **kwargs)
        # Upstream's offloading branch, with the core's current stream for torch.cuda's default
        # one (the stream decoding runs on; Dynamo traces torch.accelerator's stream calls, so
        # compiled static-cache decoding keeps one graph).
        if self.layer_class_to_replicate is not None:
            while len(self.layers) <= layer_idx:
                self.layers.append(self.layer_class_to_replicate())
        default_stream = torch.accelerator.current_stream(key_states.device)
        default_stream.wait_stream(self.prefetch_stream)
        self.prefetch_stream.wait_stream(default_stream)
        self.prefetch(layer_idx + 1, self.only_non_sliding)
        keys, values = self.layers[layer_idx].update(key_states, value_states, *args, **kwargs)
        self.offload(layer_idx, self.only_non_sliding)
        return keys, values

    return update


def _patch_offloaded_cache(module: ModuleType) -> None:
    # Upstream: Cache.update() synchronises its prefetch stream with
    # torch.cuda.default_stream(device), so cache_implementation="offloaded" or
    # "offloaded_static" raised "Torch not compiled with CUDA enabled" on neuron (and on every
    # device but CUDA). The rest of the offloading path (side stream, events, pinned
    # non-blocking copies) is device-generic and works on neuron as it is.
    replace_function(module.Cache, "update", _make_offloading_update)


FIXES = [
    Fix(
        name="transformers.PreTrainedModel.default_compile_config",
        module="transformers.modeling_utils",
        distribution="transformers",
        versions="~=5.23.0",
        corrects="generate() retraces sliding-window static-cache decoding for every token on neuron",
        apply=_patch_default_compile_config,
    ),
    Fix(
        name="transformers.Trainer.rng_state",
        module="transformers.trainer",
        distribution="transformers",
        versions="~=5.23.0",
        corrects="the Trainer's checkpoints do not save or restore the neuron RNG",
        apply=_patch_trainer_rng,
    ),
    Fix(
        name="transformers.TrainerMemoryTracker.neuron",
        module="transformers.trainer_utils",
        distribution="transformers",
        versions="~=5.23.0",
        corrects="the Trainer's memory metrics have no device (*_mem_gpu_*) figures on neuron",
        apply=_patch_memory_tracker,
    ),
    Fix(
        name="transformers.continuous_batching.memory_breakdown",
        module="transformers.generation.continuous_batching.utils",
        distribution="transformers",
        versions="~=5.23.0",
        corrects="generate_batch() sizes its paged cache from host RAM instead of the core's HBM",
        apply=_patch_continuous_batching_memory,
    ),
    Fix(
        name="transformers.Cache.offloading_stream",
        module="transformers.cache_utils",
        distribution="transformers",
        versions="~=5.23.0",
        corrects="offloaded KV caches call torch.cuda.default_stream and fail on neuron",
        apply=_patch_offloaded_cache,
    ),
    Fix(
        name="transformers.testing_utils.device_tables",
        module="transformers.testing_utils",
        distribution="transformers",
        versions="~=5.23.0",
        corrects="the test utilities' per-device tables (seed, device count, memory) have no neuron entries",
        apply=_register_testing_device,
    ),
]
