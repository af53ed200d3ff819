"""transformers' Trainer on neuron: bf16, gradient accumulation, evaluation, checkpoint and resume."""

from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import pytest
import torch
from accelerate.state import AcceleratorState
from datasets import Dataset
from transformers import DataCollatorForLanguageModeling, Trainer, TrainingArguments

import neuron_hf
from neuron_hf.testing import SENTENCES, tiny_llama, tiny_tokenizer

pytestmark = pytest.mark.filterwarnings("ignore::FutureWarning", "ignore::UserWarning")


def _dataset() -> Dataset:
    tokenizer = tiny_tokenizer()
    rows = [tokenizer(s)["input_ids"] for s in SENTENCES * 3]
    return Dataset.from_dict({"input_ids": rows})


def _trainer(output_dir: str, *, use_cpu: bool = False, dropout: float = 0.0, **overrides) -> Trainer:
    AcceleratorState._reset_state(reset_partial_state=True)
    values = dict(
        output_dir=output_dir, use_cpu=use_cpu, bf16=True, per_device_train_batch_size=2,
        gradient_accumulation_steps=2, max_steps=6, learning_rate=3e-3, warmup_steps=1, lr_scheduler_type="linear",
        logging_steps=1, eval_strategy="steps", eval_steps=3, per_device_eval_batch_size=4,
        save_strategy="steps", save_steps=2, report_to=[], disable_tqdm=True, seed=7, dataloader_num_workers=0,
    )
    values.update(overrides)
    args = TrainingArguments(**values)
    model = tiny_llama(seed=3, attention_dropout=dropout, attn_implementation="eager")
    data = _dataset()
    return Trainer(
        model=model, args=args, train_dataset=data, eval_dataset=data.select(range(8)),
        data_collator=DataCollatorForLanguageModeling(tiny_tokenizer(), mlm=False),
    )


def _losses(trainer: Trainer) -> dict[int, float]:
    return {e["step"]: e["loss"] for e in trainer.state.log_history if "loss" in e}


def _eval_losses(trainer: Trainer) -> dict[int, float]:
    return {e["step"]: e["eval_loss"] for e in trainer.state.log_history if "eval_loss" in e}


def test_bf16_accumulation_and_eval_match_cpu(tmp_path):
    neuron = _trainer(str(tmp_path / "neuron"))
    assert neuron.args.device.type == "neuron"
    neuron.train()
    assert next(neuron.model.parameters()).device.type == "neuron"
    cpu = _trainer(str(tmp_path / "cpu"), use_cpu=True)
    cpu.train()
    assert next(cpu.model.parameters()).device.type == "cpu"
    assert list(_losses(neuron)) == list(range(1, 7)) and list(_eval_losses(neuron)) == [3, 6]
    # bf16 autocast on both devices: same kernels, so the curves agree to bf16 rounding.
    torch.testing.assert_close(_losses(neuron), _losses(cpu), rtol=2e-2, atol=2e-2)
    torch.testing.assert_close(_eval_losses(neuron), _eval_losses(cpu), rtol=2e-2, atol=2e-2)
    assert _losses(neuron)[6] < _losses(neuron)[1]


def _resume_curve(tmp_path, name: str) -> tuple[dict[int, float], dict[int, float], Trainer, Trainer]:
    full = _trainer(str(tmp_path / name / "full"), dropout=0.2)
    full.train()
    resumed = _trainer(str(tmp_path / name / "resumed"), dropout=0.2)
    resumed.train(resume_from_checkpoint=str(tmp_path / name / "full" / "checkpoint-2"))
    return _losses(full), _losses(resumed), full, resumed


def test_checkpoint_resume_gives_the_identical_curve(tmp_path):
    full, resumed, full_trainer, resumed_trainer = _resume_curve(tmp_path, "fixed")
    checkpoint = tmp_path / "fixed" / "full" / "checkpoint-2"
    for name in ("model.safetensors", "optimizer.pt", "scheduler.pt", "rng_state.pth", "trainer_state.json"):
        assert (checkpoint / name).is_file(), name
    states = torch.load(checkpoint / "rng_state.pth", weights_only=False)
    assert "neuron" in states and states["neuron"].dtype == torch.uint8
    # Steps 1-2 come from the checkpoint's log history, 3-6 were run after resuming.
    assert list(resumed) == list(full) == [1, 2, 3, 4, 5, 6]
    assert resumed == full  # bit-identical, dropout masks included
    for (name, p), q in zip(full_trainer.model.named_parameters(), resumed_trainer.model.parameters()):
        assert torch.equal(p.detach().cpu(), q.detach().cpu()), name
    assert resumed_trainer.lr_scheduler.get_last_lr() == full_trainer.lr_scheduler.get_last_lr()


def test_canary_without_the_neuron_rng_state_the_resumed_curve_differs(tmp_path, monkeypatch):
    monkeypatch.setattr(Trainer, "_save_rng_state", neuron_hf.original_of(Trainer._save_rng_state))
    monkeypatch.setattr(Trainer, "_load_rng_state", neuron_hf.original_of(Trainer._load_rng_state))
    full, resumed, _, _ = _resume_curve(tmp_path, "upstream")
    assert [resumed[s] for s in (3, 4, 5, 6)] != [full[s] for s in (3, 4, 5, 6)]


def test_memory_metrics_report_the_cores_allocator(tmp_path):
    """skip_memory_metrics=False: the device figures come from torch.neuron, as CUDA's from torch.cuda."""
    trainer = _trainer(str(tmp_path / "mem"), bf16=False, max_steps=2, eval_strategy="no", save_strategy="no",
                       skip_memory_metrics=False, optim="adamw_torch")
    parameter_bytes = sum(p.numel() * p.element_size() for p in trainer.model.parameters())
    metrics = trainer.train().metrics
    # the model moved to the core during __init__; AdamW's two moments appear during training
    assert metrics["init_mem_gpu_alloc_delta"] >= parameter_bytes
    assert metrics["train_mem_gpu_alloc_delta"] >= 2 * parameter_bytes
    assert metrics["train_mem_gpu_peaked_delta"] > 0  # activations and gradients, freed by the end
    evaluation = trainer.evaluate(trainer.eval_dataset)
    assert evaluation["eval_mem_gpu_peaked_delta"] > 0
    assert {"init_mem_cpu_alloc_delta", "train_mem_cpu_alloc_delta", "eval_mem_cpu_alloc_delta"} <= {
        *metrics, *evaluation}


def test_gradient_checkpointing_with_dropout_gives_the_curve_without_it(tmp_path):
    # torch.utils.checkpoint restored no neuron RNG state (it looks for torch.neuron._initialized),
    # so the recomputed forward drew new dropout masks and the gradients were wrong. Restored,
    # recomputation changes nothing. (Against the CPU the curves differ with dropout on: there
    # the data sampler draws from the same generator as dropout, as on CUDA.)
    settings = dict(dropout=0.2, bf16=False, max_steps=4, eval_strategy="no", save_strategy="no")
    checkpointed = _trainer(str(tmp_path / "checkpointed"), gradient_checkpointing=True, **settings)
    checkpointed.train()
    plain = _trainer(str(tmp_path / "plain"), **settings)
    plain.train()
    assert checkpointed.args.device.type == "neuron" and checkpointed.model.is_gradient_checkpointing
    torch.testing.assert_close(_losses(checkpointed), _losses(plain), rtol=1e-5, atol=1e-6)
