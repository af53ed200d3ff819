"""neuron-hf's fixes, one test each, next to a canary showing the upstream behaviour is still broken.

Each canary calls the library's original function (``neuron_hf.original_of``) and asserts the
behaviour the fix corrects: when an upstream release fixes it, the canary fails and tells us to
drop the fix. The other test checks the behaviour with the fix, so it fails without it.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import pytest
import torch

import neuron_hf
from neuron_hf import original_of

pytestmark = pytest.mark.filterwarnings("ignore::FutureWarning")


def test_probes_and_lazy_glue_in_a_fresh_process():
    """Plain ``import torch``: no HF library imported yet, probes True, fixes applied on import."""
    code = textwrap.dedent("""
        import json, sys
        import torch
        before = sorted(m for m in ("transformers", "accelerate", "trl", "peft") if m in sys.modules)
        armed = "neuron_hf" in sys.modules
        from transformers.utils import is_torch_bf16_gpu_available, is_torch_neuron_available
        from accelerate.utils import get_max_memory, is_neuron_available
        import transformers.integrations.accelerate as tia
        import neuron_hf
        print(json.dumps(dict(
            before=before, armed=armed, transformers=is_torch_neuron_available(),
            bf16=is_torch_bf16_gpu_available(), accelerate=is_neuron_available(),
            accelerator=str(torch.accelerator.current_accelerator()),
            bound=[neuron_hf.original_of(f) is not f for f in (get_max_memory, tia.accelerate_max_memory)],
            applied=neuron_hf.applied_fixes(), skipped=neuron_hf.skipped_fixes())))
    """)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("NEURON_", "TORCH_DEVICE_BACKEND"))}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=240)
    assert out.returncode == 0, out.stderr[-3000:]
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert result["before"] == [], "import torch must not import the Hugging Face libraries"
    assert result["armed"]
    assert result["transformers"] and result["bf16"] and result["accelerate"]
    assert result["accelerator"] == "neuron"
    assert result["bound"] == [True, True]
    assert "accelerate.get_max_memory" in result["applied"] and result["skipped"] == {}


# -- arming ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("first", ["neuron_hf.coverage", "neuron_hf", "neuron_hf.fixes.transformers"])
def test_importing_the_glue_before_torch_arms_it_without_a_circular_import(first):
    # importing the glue imports torch, whose autoload entry point calls neuron_hf.install()
    code = (f"import {first}, torch, transformers.modeling_utils, neuron_hf\n"
            "assert 'transformers.PreTrainedModel.default_compile_config' in neuron_hf.applied_fixes()\n"
            "print('armed')")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0 and "armed" in result.stdout, result.stderr[-2000:]


# -- accelerate: get_max_memory ----------------------------------------------------------------


def test_canary_upstream_get_max_memory_has_no_neuron_branch():
    from accelerate.utils import get_max_memory

    assert set(original_of(get_max_memory)()) == {"cpu"}


def test_get_max_memory_lists_every_core():
    from accelerate.utils import get_max_memory
    from accelerate.utils.modeling import get_max_memory as in_modeling
    from transformers.integrations import accelerate as tia

    memory = get_max_memory()
    cores = [k for k in memory if isinstance(k, int)]
    assert cores == list(range(torch.neuron.device_count()))
    assert all(memory[i] == torch.neuron.mem_get_info(i)[0] for i in cores)
    assert "cpu" in memory
    assert get_max_memory is in_modeling is tia.accelerate_max_memory
    assert get_max_memory({1: "1MiB", "cpu": 10}) == {1: 2**20, "cpu": 10}
    with pytest.raises(ValueError, match="not recognized"):
        get_max_memory({"neuron:1": 10})


# -- accelerate: dispatch_model on one core ------------------------------------------------------


def _two_linears() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Linear(8, 4))


def test_canary_upstream_dispatch_model_leaves_a_single_core_model_on_the_cpu():
    from accelerate import dispatch_model

    model = _two_linears()
    original_of(dispatch_model)(model, {"": 1})
    assert {p.device.type for p in model.parameters()} == {"cpu"}


def test_dispatch_model_moves_a_single_core_model(tmp_path):
    import accelerate
    from accelerate import dispatch_model, load_checkpoint_and_dispatch
    from accelerate.big_modeling import dispatch_model as in_big_modeling

    assert dispatch_model is in_big_modeling is accelerate.dispatch_model
    model = _two_linears()
    dispatch_model(model, {"": 1})
    assert {p.device for p in model.parameters()} == {torch.device("neuron", 1)}

    # End to end: a model that fits one core gets {"": 0} from "sequential" and must land there.
    reference = _two_linears()
    torch.save(reference.state_dict(), tmp_path / "weights.bin")
    with accelerate.init_empty_weights():
        empty = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Linear(8, 4))
    loaded = load_checkpoint_and_dispatch(empty, str(tmp_path / "weights.bin"), device_map="sequential")
    assert set(loaded.hf_device_map.values()) == {0}
    assert {p.device for p in loaded.parameters()} == {torch.device("neuron", 0)}
    x = torch.randn(3, 8)
    torch.testing.assert_close(loaded(x.to("neuron")).cpu(), reference(x))


# -- accelerate: fp16 --------------------------------------------------------------------------


def _fp16_accelerator_error(init) -> str:
    from accelerate import Accelerator

    accelerator = Accelerator.__new__(Accelerator)
    with pytest.raises(ValueError) as info:
        init(accelerator, mixed_precision="fp16")
    return str(info.value)


def test_canary_upstream_fp16_error_does_not_say_what_to_use():
    from accelerate import Accelerator
    from accelerate.state import AcceleratorState

    AcceleratorState._reset_state(reset_partial_state=True)
    message = _fp16_accelerator_error(original_of(Accelerator.__init__))
    assert "neuron" in message and "bf16" not in message
    AcceleratorState._reset_state(reset_partial_state=True)


def test_fp16_on_neuron_says_use_bf16(tmp_path):
    from accelerate.state import AcceleratorState
    from datasets import Dataset
    from transformers import Trainer, TrainingArguments

    from neuron_hf.testing import tiny_llama

    AcceleratorState._reset_state(reset_partial_state=True)
    args = TrainingArguments(output_dir=str(tmp_path), fp16=True, max_steps=1, report_to=[], disable_tqdm=True)
    assert args.device.type == "neuron"
    data = Dataset.from_dict({"input_ids": [[1, 5, 6, 2]] * 4, "labels": [[1, 5, 6, 2]] * 4})
    with pytest.raises(ValueError, match=r"bf16=True"):
        Trainer(model=tiny_llama(), args=args, train_dataset=data)
    AcceleratorState._reset_state(reset_partial_state=True)


# -- safetensors / PEFT: loading to the device --------------------------------------------------


def test_canary_upstream_safetensors_rejects_neuron(tmp_path):
    import safetensors.torch

    path = str(tmp_path / "t.safetensors")
    safetensors.torch.save_file({"w": torch.arange(6.0)}, path)
    with pytest.raises(Exception, match="device neuron is invalid"):
        original_of(safetensors.torch.load_file)(path, device="neuron")


@pytest.mark.parametrize("device", ["neuron", "neuron:2", torch.device("neuron", 1)])
def test_safetensors_loads_to_neuron(tmp_path, device):
    import safetensors.torch
    from peft.utils import save_and_load

    path = str(tmp_path / "t.safetensors")
    safetensors.torch.save_file({"w": torch.arange(6.0)}, path)
    expected = torch.device(device) if torch.device(device).index is not None else torch.device("neuron", 0)
    for load in (safetensors.torch.load_file, save_and_load.safe_load_file):
        w = load(path, device=device)["w"]
        assert w.device == expected
        torch.testing.assert_close(w.cpu(), torch.arange(6.0))


def test_canary_upstream_peft_infer_device_says_cpu():
    from peft.utils import infer_device

    assert original_of(infer_device)() == "cpu"


def test_peft_infer_device_and_every_binding():
    import peft.peft_model
    import peft.utils.hotswap
    import peft.utils.save_and_load
    from peft.utils import infer_device

    assert infer_device() == "neuron"
    for module in (peft.peft_model, peft.utils.hotswap, peft.utils.save_and_load):
        assert module.infer_device is infer_device, module.__name__


# -- TRL: create_model_from_path --------------------------------------------------------------


class _Recorder:
    """Stands for a model class: records the from_pretrained kwargs TRL passes."""

    calls: list[dict] = []

    @classmethod
    def from_pretrained(cls, model_id: str, **kwargs):
        cls.calls.append(kwargs)
        return "model"


def _device_map_passed(create, **kwargs):
    _Recorder.calls.clear()
    create("unused/model", _Recorder, **kwargs)
    return _Recorder.calls[-1]["device_map"]


def test_canary_upstream_trl_forces_auto_on_neuron():
    from trl.trainer.utils import create_model_from_path

    assert _device_map_passed(original_of(create_model_from_path), distributed_config=object()) == "auto"


def test_trl_device_map_single_process_and_distributed_config():
    from trl.trainer.utils import create_model_from_path

    device_map = _device_map_passed(create_model_from_path)
    assert list(device_map) == [""] and torch.device(device_map[""]).type == "neuron"
    assert _device_map_passed(create_model_from_path, distributed_config=object()) is None
    assert _device_map_passed(create_model_from_path, device_map="sequential") == "sequential"  # the user's choice


def test_trl_device_map_under_multi_neuron(monkeypatch):
    import accelerate.state
    from accelerate.utils import DistributedType
    from trl.trainer.utils import create_model_from_path

    class _MultiNeuronState:
        device = torch.device("neuron", 1)
        distributed_type = DistributedType.MULTI_NEURON

    monkeypatch.setattr(accelerate.state, "PartialState", _MultiNeuronState)
    assert _device_map_passed(create_model_from_path) is None


def test_trl_every_binding_is_fixed():
    import importlib

    from trl.trainer.utils import create_model_from_path

    for name in ("sft", "dpo", "grpo", "kto", "rloo", "reward", "distillation"):
        module = importlib.import_module(f"trl.trainer.{name}_trainer")
        assert module.create_model_from_path is create_model_from_path, name
    assert original_of(create_model_from_path) is not create_model_from_path


def test_trl_loads_whole_model_on_one_core(tmp_path):
    """End to end: TRL's loader on one process puts the model on this process's core, not spread."""
    from trl.trainer.utils import create_model_from_path

    from neuron_hf.testing import save_tiny_llama

    model = create_model_from_path(save_tiny_llama(tmp_path / "m"))
    assert {p.device for p in model.parameters()} == {torch.device("neuron", 0)}
    assert len(set(getattr(model, "hf_device_map", {"": 0}).values())) == 1


def test_glue_applied_without_version_skips():
    assert neuron_hf.skipped_fixes() == {}


def test_canary_upstream_is_fp16_available_says_yes_on_neuron():
    from accelerate.utils import is_fp16_available

    assert original_of(is_fp16_available)() is True


def test_is_fp16_available_is_false_on_neuron_in_every_binding():
    """`accelerate test` runs an FP16 check when is_fp16_available(); accelerate refuses fp16 on neuron."""
    import accelerate.test_utils.scripts.test_script as test_script
    import accelerate.test_utils.testing as testing
    import accelerate.utils
    from accelerate.utils.imports import is_fp16_available

    assert is_fp16_available() is False
    for module in (accelerate.utils, test_script, testing):
        assert module.is_fp16_available is is_fp16_available, module.__name__


# -- transformers: the device tables of its test utilities --------------------------------------

_TESTING_TABLES = ("BACKEND_MANUAL_SEED", "BACKEND_EMPTY_CACHE", "BACKEND_DEVICE_COUNT",
                   "BACKEND_RESET_MAX_MEMORY_ALLOCATED", "BACKEND_RESET_PEAK_MEMORY_STATS",
                   "BACKEND_MAX_MEMORY_ALLOCATED", "BACKEND_MEMORY_ALLOCATED", "BACKEND_SYNCHRONIZE",
                   "BACKEND_TORCH_ACCELERATOR_MODULE")


def test_canary_upstream_testing_utils_has_no_neuron_entries():
    """Without the device plugins (so without the glue), transformers' own tables lack neuron."""
    code = ("import json, transformers.testing_utils as tu\n"
            f"print(json.dumps([t for t in {_TESTING_TABLES!r} if 'neuron' in getattr(tu, t)]))")
    env = dict(os.environ, TORCH_DEVICE_BACKEND_AUTOLOAD="0")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=240)
    assert out.returncode == 0, out.stderr[-3000:]
    assert json.loads(out.stdout.strip().splitlines()[-1]) == []


def test_testing_utils_dispatch_to_the_neuron_device():
    """``TRANSFORMERS_TEST_DEVICE=neuron`` test suites see the real core count, memory and seed."""
    import transformers.testing_utils as tu

    assert all("neuron" in getattr(tu, table) for table in _TESTING_TABLES)
    assert tu.backend_device_count("neuron") == torch.neuron.device_count()
    assert tu.backend_torch_accelerator_module("neuron") is torch.neuron
    tu.backend_synchronize("neuron")
    tu.backend_empty_cache("neuron")
    held = torch.ones(1 << 16, device="neuron")
    assert tu.backend_memory_allocated("neuron") == torch.neuron.memory_allocated() >= held.nbytes
    peak = torch.ones(1 << 18, device="neuron")
    del peak
    assert tu.backend_max_memory_allocated("neuron") >= torch.neuron.memory_allocated() + (1 << 20)
    tu.backend_reset_peak_memory_stats("neuron")
    assert tu.backend_max_memory_allocated("neuron") == torch.neuron.memory_allocated()
    tu.backend_manual_seed("neuron", 7)
    first = torch.randn(4, device="neuron")
    torch.neuron.manual_seed(7)
    assert torch.equal(first, torch.randn(4, device="neuron"))
    torch.neuron.manual_seed(8)
    assert not torch.equal(first, torch.randn(4, device="neuron"))


# -- transformers: continuous batching's memory budget ------------------------------------------


def test_canary_upstream_continuous_batching_budgets_host_memory_on_neuron():
    from transformers.generation.continuous_batching.utils import get_device_and_memory_breakdown

    device, total, _, _ = original_of(get_device_and_memory_breakdown)()
    assert device.type == "cpu" and total != torch.neuron.mem_get_info()[1]


def test_generate_batch_sizes_its_cache_from_the_core(tmp_path):
    """On a 1 GiB core, generate_batch() sized its paged cache from host RAM and ran out of memory."""
    script = tmp_path / "generate_batch.py"
    script.write_text(textwrap.dedent(
        """
        import logging
        import torch
        from transformers import GenerationConfig, LlamaConfig, LlamaForCausalLM
        from transformers.generation.continuous_batching import cache

        logging.getLogger("ContinuousBatchingLogger").setLevel(logging.ERROR)
        config = LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                             num_attention_heads=4, num_key_value_heads=2, vocab_size=256)
        torch.manual_seed(0)
        model = LlamaForCausalLM(config).eval()
        prompts = [[1, 5, 7, 9], [3, 4, 5, 6, 7, 8], [10, 11]]
        expected = [model.generate(torch.tensor([p]), max_new_tokens=5, do_sample=False)[0, len(p):].tolist()
                    for p in prompts]
        device, total, _, _ = cache.get_device_and_memory_breakdown()
        model.to("neuron")
        config = GenerationConfig(max_new_tokens=5, do_sample=False, eos_token_id=-1, pad_token_id=0)
        results = model.generate_batch(prompts, generation_config=config)
        got = sorted(r.generated_tokens for r in results.values())
        print(device.type, total == torch.neuron.mem_get_info()[1], got == sorted(expected),
              torch.neuron.max_memory_reserved() <= (1 << 30))
        """
    ))
    env = {k: v for k, v in os.environ.items() if not k.startswith("NEURON_")}
    env["NEURON_EMU_HBM_GIB"] = "1"
    out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, env=env, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.strip().splitlines()[-1] == "neuron True True True"


def test_dispatch_with_disk_offload_keeps_tied_weights_apart(tmp_path):
    """accelerate keys tied weights by their host address at dispatch time; a disk-offloaded
    weight loaded later at a freed address used to receive GPT-2's tied embedding instead
    (shape error in the offloaded layer)."""
    from accelerate import dispatch_model
    from accelerate.utils import offload_state_dict
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    config = GPT2Config(n_layer=12, n_embd=64, n_head=4, vocab_size=1000, n_positions=64,
                        bos_token_id=0, eos_token_id=999)
    weights = GPT2LMHeadModel(config).state_dict()

    def fresh():
        model = GPT2LMHeadModel(config)
        model.load_state_dict(weights)
        return model.eval()

    ids = torch.tensor([[1, 5, 17, 42, 99, 3]])
    expected = fresh().generate(ids, max_new_tokens=10, do_sample=False)
    device_map = {"transformer.wte": 0, "transformer.wpe": 0, "transformer.ln_f": 0, "lm_head": 0}
    device_map |= {f"transformer.h.{i}": "disk" if i < 2 else "cpu" if i < 4 else 0 for i in range(12)}
    for attempt in range(3):  # the address reuse is likely, not certain, on any one run
        model = fresh()
        offload_state_dict(str(tmp_path / str(attempt)), {
            name: value for name, value in model.state_dict().items()
            if name.startswith(("transformer.h.0.", "transformer.h.1."))})
        dispatched = dispatch_model(model, device_map, offload_dir=str(tmp_path / str(attempt)))
        got = dispatched.generate(ids.to("neuron"), max_new_tokens=10, do_sample=False)
        assert torch.equal(got.cpu(), expected)


def test_the_cache_budget_never_exceeds_the_ram_the_host_has_left():
    """Emulated HBM is host RAM: a core larger than the machine must not size the paged cache."""
    code = textwrap.dedent(
        """
        import torch
        from neuron_runtime import _C
        from transformers.generation.continuous_batching import cache

        device, total, _, used = cache.get_device_and_memory_breakdown()
        print(device.type, total < torch.neuron.mem_get_info()[1],
              total - used <= _C._host_available_bytes() + (64 << 20))
        """
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("NEURON_")}
    env["NEURON_EMU_HBM_GIB"] = "100000"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.strip().splitlines()[-1] == "neuron True True"


# -- transformers: offloaded KV caches ----------------------------------------------------------


def test_canary_upstream_offloaded_cache_calls_torch_cuda():
    import inspect

    from transformers.cache_utils import Cache

    assert "torch.cuda.default_stream" in inspect.getsource(original_of(Cache.update))


@pytest.mark.parametrize("implementation", ["offloaded", "offloaded_static"])
def test_offloaded_kv_caches_generate_as_on_the_cpu(implementation):
    """cache_implementation="offloaded"/"offloaded_static" raised "Torch not compiled with CUDA"."""
    from neuron_hf.testing import tiny_llama

    model = tiny_llama().eval()
    prompt = torch.tensor([[5, 9, 14, 3, 27, 8, 40]])
    expected = model.generate(prompt, max_new_tokens=10, do_sample=False)
    model.to("neuron")
    got = model.generate(prompt.to("neuron"), max_new_tokens=10, do_sample=False,
                         cache_implementation=implementation)
    assert torch.equal(got.cpu(), expected)
