"""TRL's SFTTrainer on one neuron core: the model is loaded by TRL, batches are padded to 128.

The padding is checked on the tensors the trainer actually feeds the model (a forward
pre-hook), and the loss curve against the same run on the CPU (no padding there).
"""

from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import pytest
import torch
from accelerate.state import AcceleratorState
from datasets import Dataset
from trl import SFTConfig, SFTTrainer

from neuron_hf.testing import SENTENCES, save_tiny_llama, tiny_tokenizer

pytestmark = pytest.mark.filterwarnings("ignore::FutureWarning", "ignore::UserWarning")


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory: pytest.TempPathFactory) -> str:
    return save_tiny_llama(tmp_path_factory.mktemp("sft_llama"), seed=5)


def _run(checkpoint: str, output_dir: str, use_cpu: bool, **overrides) -> tuple[SFTTrainer, list[dict[str, torch.Tensor]]]:
    AcceleratorState._reset_state(reset_partial_state=True)
    args = SFTConfig(
        output_dir=output_dir, use_cpu=use_cpu, per_device_train_batch_size=4, max_steps=4, learning_rate=3e-3,
        logging_steps=1, save_strategy="no", report_to=[], disable_tqdm=True, seed=11, max_length=64, **overrides,
    )
    data = Dataset.from_dict({"text": list(SENTENCES) * 2})
    trainer = SFTTrainer(model=checkpoint, args=args, train_dataset=data, processing_class=tiny_tokenizer())
    fed: list[dict[str, torch.Tensor]] = []

    def record(module, args, kwargs):
        fed.append({k: v.detach().clone() for k, v in kwargs.items() if isinstance(v, torch.Tensor)})

    handle = trainer.model.register_forward_pre_hook(record, with_kwargs=True)
    trainer.train()
    handle.remove()
    return trainer, fed


def test_sft_single_core_pads_to_128_and_matches_cpu(checkpoint, tmp_path):
    neuron, fed = _run(checkpoint, str(tmp_path / "neuron"), use_cpu=False)
    assert neuron.args.pad_to_multiple_of == 128
    assert {p.device for p in neuron.model.parameters()} == {torch.device("neuron", 0)}
    assert len(fed) == 4
    for batch in fed:
        ids, mask = batch["input_ids"], batch["attention_mask"]
        assert ids.device.type == "neuron" and ids.shape[1] % 128 == 0, ids.shape
        assert batch["labels"].shape == ids.shape
        real = int(mask.sum())
        assert 0 < real < ids.numel()  # padding really was added
        assert bool((batch["labels"][mask == 0] == -100).all())

    cpu, cpu_fed = _run(checkpoint, str(tmp_path / "cpu"), use_cpu=True)
    assert cpu.args.pad_to_multiple_of is None
    assert all(b["input_ids"].shape[1] < 128 for b in cpu_fed)
    # Same real tokens in the same order: only the padding differs.
    for a, b in zip(fed, cpu_fed):
        assert torch.equal(a["input_ids"][a["attention_mask"].bool()].cpu(), b["input_ids"][b["attention_mask"].bool()])
    losses = [e["loss"] for e in neuron.state.log_history if "loss" in e]
    cpu_losses = [e["loss"] for e in cpu.state.log_history if "loss" in e]
    assert len(losses) == 4
    torch.testing.assert_close(losses, cpu_losses, rtol=2e-2, atol=2e-2)


@pytest.mark.parametrize("bf16", [False, True], ids=["fp32", "bf16"])
def test_sft_with_torch_compile_and_trls_default_gradient_checkpointing(checkpoint, tmp_path, monkeypatch, bf16):
    """TRL turns gradient checkpointing on by default; compiled, the recomputed attention runs
    under torch's RNG-functionalisation operators, which had no neuron kernel. With TRL's
    default bf16, the compiler traces the step on the device under autocast first (neuron's
    cast policy), where those operators meet neuron's autocast key."""
    monkeypatch.delenv("ACCELERATE_DYNAMO_BACKEND", raising=False)  # torch_compile=True exports it
    compiled, _ = _run(checkpoint, str(tmp_path / "compiled"), use_cpu=False, torch_compile=True, bf16=bf16)
    torch._dynamo.reset()
    assert compiled.args.gradient_checkpointing and compiled.args.torch_compile_backend == "neuron"
    eager, _ = _run(checkpoint, str(tmp_path / "eager"), use_cpu=False, bf16=bf16)
    losses = [e["loss"] for e in compiled.state.log_history if "loss" in e]
    eager_losses = [e["loss"] for e in eager.state.log_history if "loss" in e]
    assert len(losses) == 4
    # bf16: Inductor keeps fused intermediates in float32 where eager rounds them to bfloat16.
    torch.testing.assert_close(losses, eager_losses, rtol=1e-3 if bf16 else 1e-4, atol=1e-5)
