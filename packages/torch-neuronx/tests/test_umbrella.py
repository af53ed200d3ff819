"""The umbrella package: what the Hugging Face libraries probe for, and the CLI."""

from __future__ import annotations

import importlib.util
import subprocess
import sys

import torch


def test_find_spec_probe_and_import():
    assert importlib.util.find_spec("torch_neuronx") is not None
    import torch_neuronx

    assert callable(torch_neuronx.get_fallback_ops)
    assert isinstance(torch_neuronx.get_float64_ops(), dict)


def test_hf_contract_functions_exist():
    for name in (
        "device_count", "current_device", "set_device", "is_available", "is_bf16_supported",
        "get_device_name", "get_device_properties", "empty_cache", "memory_allocated",
        "max_memory_allocated", "reset_peak_memory_stats", "manual_seed_all", "get_rng_state",
        "get_rng_state_all", "set_rng_state", "set_rng_state_all", "is_initialized", "init", "device",
        "get_device_capability", "synchronize", "Stream", "Event", "stream", "current_stream",
        "default_stream", "set_stream", "seed", "seed_all", "initial_seed", "memory_stats",
        "memory_reserved", "max_memory_reserved", "reset_accumulated_memory_stats", "memory_summary",
        "mem_get_info", "get_amp_supported_dtype",
    ):
        assert callable(getattr(torch.neuron, name)), name
    assert torch.neuron.is_bf16_supported()


def test_executed_op_metrics(tmp_path):
    code = (
        "import torch, torch_neuronx\n"
        "x = torch.ones(4, device='neuron'); (x * 3).sum()\n"
        "ops = torch_neuronx.get_executed_ops(); print(any(k.startswith('aten::mul') for k in ops))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         env={"TORCH_NEURONX_METRICS_ENABLED": "1", "PATH": ""}, timeout=120)
    assert out.stdout.strip() == "True", out.stderr


def test_cli_info():
    out = subprocess.run([sys.executable, "-m", "torch_neuronx.cli", "info"], capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr
    assert "trn2" in out.stdout and "neuron:3" in out.stdout


def test_metrics_report_covers_eager_compile_cache_and_memory(tmp_path, monkeypatch):
    import torch

    import torch_neuronx
    from neuron_compile.cache import default_cache

    monkeypatch.setenv("TORCH_NEURONX_NEFF_CACHE_DIR", str(tmp_path))
    default_cache.cache_clear()
    x = torch.randn(64, 64, device="neuron")
    with torch.no_grad():
        torch.compile(lambda a: (a @ a).relu(), backend="neuron")(x)
    figures = torch_neuronx.metrics.counters()
    assert figures["compile"]["compilations"] >= 1
    assert figures["memory"][0]["allocated"] >= 64 * 64 * 4
    assert figures["memory"][0]["capacity"] > 0
    text = torch_neuronx.metrics.report()
    for needle in ("eager: ops that needed a copy", "neuron compiler", "persistent cache", str(tmp_path),
                   "memory per core", "neuron:0"):
        assert needle in text, needle
    # Cores this process never touched are summarised, not listed (which cores earlier tests in
    # the same process touched varies, so the expectation comes from the figures).
    unused = [c["core"] for c in figures["memory"]
              if not (c["peak"] or c["reserved"] or c["ooms"]) and c["core"] != torch.neuron.current_device()]
    for core in unused:
        assert f"neuron:{core} " not in text, core
    assert (f"({len(unused)} other cores not used by this process)" in text) == bool(unused), text
    default_cache.cache_clear()
