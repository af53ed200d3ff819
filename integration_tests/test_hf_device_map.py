"""``from_pretrained(device_map=...)`` on neuron: one core, explicit maps, "auto" over cores, bad input.

Every placement is checked parameter by parameter and the logits against the same checkpoint
run on the CPU.
"""

from __future__ import annotations

import gc
import json
import os
import subprocess
import sys
import textwrap
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import pytest
import torch
from transformers import AutoModelForCausalLM

from neuron_hf.testing import save_tiny_llama

pytestmark = pytest.mark.filterwarnings("ignore::FutureWarning")

_INPUT = torch.tensor([[1, 5, 9, 13, 2, 7, 4, 11]])


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory: pytest.TempPathFactory) -> str:
    return save_tiny_llama(tmp_path_factory.mktemp("tiny_llama"))


@pytest.fixture(scope="module")
def cpu_logits(checkpoint: str) -> torch.Tensor:
    return AutoModelForCausalLM.from_pretrained(checkpoint)(_INPUT).logits.detach()


def _load(checkpoint: str, device_map, **kwargs):
    gc.collect()
    torch.neuron.empty_cache()
    return AutoModelForCausalLM.from_pretrained(checkpoint, device_map=device_map, **kwargs)


def _placement(model) -> dict[str, torch.device]:
    return {name: p.device for name, p in model.named_parameters()}


def _check_logits(model, cpu_logits: torch.Tensor, input_device: str = "neuron:0") -> None:
    with torch.no_grad():
        logits = model(_INPUT.to(input_device)).logits
    assert logits.device.type == "neuron"
    torch.testing.assert_close(logits.cpu(), cpu_logits, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize(
    "device_map, core",
    [("neuron", 0), (0, 0), ("neuron:1", 1), (torch.device("neuron", 3), 3), ({"": "neuron:2"}, 2), ({"": 1}, 1)],
)
def test_single_core(checkpoint, cpu_logits, device_map, core):
    model = _load(checkpoint, device_map)
    assert set(_placement(model).values()) == {torch.device("neuron", core)}
    assert model.lm_head.weight.device == model.model.embed_tokens.weight.device
    _check_logits(model, cpu_logits, f"neuron:{core}")


def test_explicit_map_over_four_cores(checkpoint, cpu_logits):
    device_map = {
        "model.embed_tokens": "neuron:0", "model.layers.0": "neuron:1", "model.layers.1": 2,
        "model.norm": "neuron:3", "model.rotary_emb": "neuron:3", "lm_head": torch.device("neuron", 3),
    }
    model = _load(checkpoint, device_map)
    placement = _placement(model)
    assert placement["model.embed_tokens.weight"] == torch.device("neuron", 0)
    assert placement["model.layers.0.mlp.up_proj.weight"] == torch.device("neuron", 1)
    assert placement["model.layers.1.self_attn.q_proj.weight"] == torch.device("neuron", 2)
    assert placement["lm_head.weight"] == torch.device("neuron", 3)
    _check_logits(model, cpu_logits)


@pytest.mark.parametrize("strategy", ["auto", "balanced", "sequential"])
def test_auto_maps_spread_over_cores_when_one_is_too_small(checkpoint, cpu_logits, strategy):
    # Each core may hold 250 KB of this ~420 KB model (accelerate also keeps room for the largest
    # layer on the first core): it must be spread over cores, never sent to the CPU or disk.
    max_memory = {i: 250_000 for i in range(torch.neuron.device_count())}
    model = _load(checkpoint, strategy, max_memory=max_memory)
    devices = set(_placement(model).values())
    assert all(d.type == "neuron" for d in devices), devices
    assert len(devices) >= 3, devices
    assert set(model.hf_device_map.values()) <= set(range(torch.neuron.device_count()))
    _check_logits(model, cpu_logits)


def test_auto_without_max_memory_uses_the_cores(checkpoint, cpu_logits):
    model = _load(checkpoint, "auto")
    assert all(d.type == "neuron" for d in _placement(model).values())
    _check_logits(model, cpu_logits)


def test_auto_spreads_by_hbm_capacity_in_a_fresh_process(checkpoint):
    """NEURON_EMU_HBM_GIB makes one core (~256 KiB) too small for the model: "auto" and
    "sequential" must spread it over the cores from their free HBM alone."""
    code = textwrap.dedent(f"""
        import gc, json, torch
        from transformers import AutoModelForCausalLM
        x = torch.tensor({_INPUT.tolist()})
        ref = AutoModelForCausalLM.from_pretrained({checkpoint!r})(x).logits
        size = sum(p.numel() * p.element_size() for p in AutoModelForCausalLM.from_pretrained({checkpoint!r}).parameters())
        result = dict(size=size, capacity=torch.neuron.mem_get_info(0)[1])
        for strategy in ("auto", "sequential"):
            m = AutoModelForCausalLM.from_pretrained({checkpoint!r}, device_map=strategy)
            err = (m(x.to("neuron:0")).logits.cpu() - ref).abs().max().item()
            result[strategy] = dict(devices=sorted({{str(p.device) for p in m.parameters()}}), err=err)
            del m; gc.collect(); torch.neuron.empty_cache()
        print(json.dumps(result))
    """)
    env = dict(os.environ, NEURON_EMU_HBM_GIB="0.00025", HF_HUB_OFFLINE="1")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=240)
    assert out.returncode == 0, out.stderr[-3000:]
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert result["size"] > result["capacity"]
    for strategy in ("auto", "sequential"):
        devices = result[strategy]["devices"]
        assert len(devices) >= 2 and all(d.startswith("neuron:") for d in devices), (strategy, devices)
        assert result[strategy]["err"] <= 1e-5, strategy


@pytest.mark.parametrize("device_map", ["neuron:7", 9, {"": "neuron:4"}])
def test_core_that_does_not_exist(checkpoint, device_map):
    last = torch.neuron.device_count() - 1
    with pytest.raises(RuntimeError, match=rf"Invalid device index .*valid indices are 0\.\.{last}"):
        _load(checkpoint, device_map)


def test_hub_id_without_network_fails_fast_with_the_library_error():
    import huggingface_hub.constants

    assert huggingface_hub.constants.HF_HUB_OFFLINE, "the test suite runs with HF_HUB_OFFLINE=1"
    start = time.monotonic()
    with pytest.raises(OSError, match="couldn't connect|offline"):
        AutoModelForCausalLM.from_pretrained("nonexistent-org/not-cached-model", device_map="neuron")
    assert time.monotonic() - start < 10
