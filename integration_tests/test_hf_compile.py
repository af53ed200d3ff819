"""transformers compiled with the neuron backend: ``Trainer(torch_compile=True)`` and static-cache ``generate``.

* Training: ``TrainingArguments(torch_compile=True)`` on neuron picks backend "neuron" by itself;
  the compiled run's fp32 loss curve equals the eager neuron run of the same steps.
* Generation: ``generate(..., cache_implementation="static")`` on neuron compiles the decode step
  with the neuron backend (transformers' default ``CompileConfig`` for the device); greedy tokens
  equal eager CPU generation, sampling with a fixed seed is valid and reproducible; a
  sliding-window cache's length is a run-time argument, not a new trace per token.

Every test uses its own persistent compile cache directory, so graphs really are compiled here
(or found in this process's memory), and the metrics are reset first.
"""

from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import pytest
import torch
from accelerate.state import AcceleratorState
from datasets import Dataset
from transformers import DataCollatorForLanguageModeling, Trainer, TrainingArguments

import neuron_compile
import neuron_compile.cache
import neuron_compile.metrics
from neuron_hf.testing import SENTENCES, tiny_llama, tiny_tokenizer

pytestmark = pytest.mark.filterwarnings("ignore::FutureWarning", "ignore::UserWarning")

STEPS = 3
NEW_TOKENS = 8


@pytest.fixture
def compile_cache(tmp_path, monkeypatch):
    """A fresh persistent compile cache, fresh Dynamo state and zeroed neuron_compile metrics."""
    directory = tmp_path / "neff_cache"
    monkeypatch.setenv(neuron_compile.cache.ENV_CACHE_DIR, str(directory))
    monkeypatch.delenv(neuron_compile.cache.ENV_DISABLE_CACHE, raising=False)
    # TrainingArguments(torch_compile=True) exports ACCELERATE_DYNAMO_BACKEND; undone at teardown.
    monkeypatch.delenv("ACCELERATE_DYNAMO_BACKEND", raising=False)
    neuron_compile.cache.default_cache.cache_clear()
    torch._dynamo.reset()
    neuron_compile.metrics.reset()
    yield directory
    neuron_compile.cache.default_cache.cache_clear()
    torch._dynamo.reset()


# ----------------------------------------------------------------------------- Trainer(torch_compile=True)


def _train(output_dir: str, *, compile: bool) -> Trainer:
    AcceleratorState._reset_state(reset_partial_state=True)
    args = TrainingArguments(
        output_dir=output_dir, torch_compile=compile, bf16=False, per_device_train_batch_size=2, max_steps=STEPS,
        learning_rate=3e-3, lr_scheduler_type="constant", logging_steps=1, save_strategy="no", report_to=[],
        disable_tqdm=True, seed=7, dataloader_num_workers=0,
    )
    tokenizer = tiny_tokenizer()
    data = Dataset.from_dict({"input_ids": [tokenizer(s)["input_ids"] for s in SENTENCES]})
    # Every sentence is shorter than 16 tokens: one batch shape (2, 16), so one graph per pass.
    collator = DataCollatorForLanguageModeling(tokenizer, mlm=False, pad_to_multiple_of=16)
    model = tiny_llama(seed=3, attn_implementation="sdpa")
    trainer = Trainer(model=model, args=args, train_dataset=data, data_collator=collator)
    trainer.train()
    return trainer


def _losses(trainer: Trainer) -> list[float]:
    return [e["loss"] for e in trainer.state.log_history if "loss" in e]


def test_trainer_torch_compile_uses_neuron_backend_and_matches_eager(compile_cache, tmp_path, monkeypatch):
    eager = _train(str(tmp_path / "eager"), compile=False)
    assert eager.args.device.type == "neuron"
    assert neuron_compile.metrics.counters()["graphs"] == 0  # the reference really ran eagerly

    compiled = _train(str(tmp_path / "compiled"), compile=True)
    assert compiled.args.device.type == "neuron"
    assert compiled.args.torch_compile_backend == "neuron"
    assert next(compiled.model.parameters()).device.type == "neuron"
    counters = neuron_compile.metrics.counters()
    records = neuron_compile.metrics.graphs()
    assert counters["graphs"] >= 1, neuron_compile.metrics.report()
    assert counters["compilations"] >= 1 and counters["eager_fallbacks"] == 0, neuron_compile.metrics.report()
    assert any(r.kernels > 0 for r in records)
    # The compiled executables went to this test's persistent cache.
    assert compile_cache.is_dir() and any(p.is_file() for p in compile_cache.rglob("*"))

    eager_losses, compiled_losses = _losses(eager), _losses(compiled)
    assert len(compiled_losses) == len(eager_losses) == STEPS
    # Same fp32 arithmetic on the same device; only the fusion of the kernels differs.
    torch.testing.assert_close(compiled_losses, eager_losses, rtol=1e-4, atol=1e-5)
    assert compiled_losses[-1] < compiled_losses[0]  # it trained


# ----------------------------------------------------------------------------- generate(cache_implementation="static")


def _prompts() -> dict[str, torch.Tensor]:
    tokenizer = tiny_tokenizer()
    # Two prompts of the same length: no padding, one prompt shape.
    batch = tokenizer(["the neuron core runs the", "a small language model learns"], return_tensors="pt")
    assert batch["input_ids"].shape == (2, 5)
    return dict(batch)


def _generate(model: torch.nn.Module, inputs: dict[str, torch.Tensor], **kwargs) -> torch.Tensor:
    with torch.no_grad():
        return model.generate(**inputs, max_new_tokens=NEW_TOKENS, cache_implementation="static", pad_token_id=0,
                              min_new_tokens=NEW_TOKENS, **kwargs)


def test_static_cache_greedy_generate_is_compiled_and_matches_cpu(compile_cache):
    inputs = _prompts()
    cpu_model = tiny_llama(seed=11).eval()
    expected = _generate(cpu_model, inputs, do_sample=False)
    assert neuron_compile.metrics.counters()["graphs"] == 0  # the CPU reference is not compiled
    assert expected.shape == (2, 5 + NEW_TOKENS)

    model = tiny_llama(seed=11).to("neuron").eval()
    out = _generate(model, {k: v.to("neuron") for k, v in inputs.items()}, do_sample=False)
    assert out.device.type == "neuron"
    counters = neuron_compile.metrics.counters()
    assert counters["graphs"] >= 1 and counters["eager_fallbacks"] == 0, neuron_compile.metrics.report()
    assert model._last_compile_config.backend == "neuron"  # transformers' choice for the device
    assert torch.equal(out.cpu(), expected), (out.cpu(), expected)
    # Not a constant answer: the random model does not repeat one token everywhere.
    assert len(set(expected[:, 5:].flatten().tolist())) > 1


def test_static_cache_sampled_generate_is_compiled_and_reproducible(compile_cache):
    inputs = {k: v.to("neuron") for k, v in _prompts().items()}
    model = tiny_llama(seed=11).to("neuron").eval()
    runs = []
    for _ in range(2):
        torch.manual_seed(1234)
        runs.append(_generate(model, inputs, do_sample=True, top_k=20, temperature=1.5).cpu())
    counters = neuron_compile.metrics.counters()
    assert counters["graphs"] >= 1 and counters["eager_fallbacks"] == 0, neuron_compile.metrics.report()
    assert model._last_compile_config.backend == "neuron"
    first, second = runs
    assert first.shape == (2, 5 + NEW_TOKENS) and first.dtype == torch.long
    assert torch.equal(first[:, :5], inputs["input_ids"].cpu())
    assert bool(((first >= 0) & (first < model.config.vocab_size)).all())
    assert torch.equal(first, second)  # same seed, same samples
    torch.manual_seed(99)
    other = _generate(model, inputs, do_sample=True, top_k=20, temperature=1.5).cpu()
    assert not torch.equal(other, first)  # the seed matters: it really sampled


def test_sliding_window_static_cache_traces_decoding_once_not_per_token(compile_cache):
    """Mistral's sliding-window static cache keeps its length in a Python int. Decoding past the
    window must not make Dynamo trace the step again for every token (it did, ~1 s a token):
    the length becomes a run-time argument, greedy tokens equal the CPU's."""
    from transformers import MistralConfig, MistralForCausalLM

    config = MistralConfig(vocab_size=128, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                           num_attention_heads=4, num_key_value_heads=2, sliding_window=8,
                           max_position_embeddings=64)
    torch.manual_seed(5)
    cpu_model = MistralForCausalLM(config).eval()
    ids = torch.randint(1, 128, (1, 5))
    new_tokens = 20  # crosses the window: not full, becoming full, then rolling
    with torch.no_grad():
        expected = cpu_model.generate(ids, max_new_tokens=new_tokens, min_new_tokens=new_tokens, do_sample=False)
        model = cpu_model.to("neuron")
        torch._dynamo.utils.clear_compilation_metrics()
        out = model.generate(ids.to("neuron"), max_new_tokens=new_tokens, min_new_tokens=new_tokens,
                             do_sample=False, cache_implementation="static")
    assert torch.equal(out.cpu(), expected), (out.cpu(), expected)
    counters = neuron_compile.metrics.counters()
    assert counters["eager_fallbacks"] == 0, neuron_compile.metrics.report()
    # First length, then symbolic lengths before and after the window fills: a few traces, not 19.
    assert counters["recompilations"] <= 3, neuron_compile.metrics.report()
    assert counters["graphs"] <= 4, neuron_compile.metrics.report()


def test_flex_attention_model_trains_on_neuron_and_matches_sdpa_on_cpu(compile_cache):
    """``attn_implementation="flex_attention"``: transformers compiles flex attention with the
    default backend, which on neuron tensors is the neuron compiler; with left padding, the loss,
    the real tokens' logits and every gradient equal an SDPA model's on the CPU."""
    import copy

    torch.manual_seed(0)
    cpu = tiny_llama(attn_implementation="sdpa")
    device = copy.deepcopy(cpu).to("neuron")
    device.config._attn_implementation = "flex_attention"
    ids = torch.randint(0, cpu.config.vocab_size, (2, 64))
    mask = torch.ones(2, 64, dtype=torch.long)
    mask[1, :10] = 0
    want = cpu(input_ids=ids, attention_mask=mask, labels=ids)
    got = device(input_ids=ids.to("neuron"), attention_mask=mask.to("neuron"), labels=ids.to("neuron"))
    want.loss.backward()
    got.loss.backward()
    torch.testing.assert_close(got.loss.cpu(), want.loss.detach())
    real = mask.bool()
    torch.testing.assert_close(got.logits.detach().cpu()[real], want.logits.detach()[real])
    for (name, expected), actual in zip(cpu.named_parameters(), device.parameters()):
        torch.testing.assert_close(actual.grad.cpu(), expected.grad, msg=name)
    names = {record.name.split("[")[0] for record in neuron_compile.metrics.graphs()}
    assert "flex_attention" in names, "transformers' flex attention ran through the neuron compiler"
