"""Shared pieces of the distributed SFT test, and its torchrun worker.

* :func:`save_checkpoint` writes a tiny Llama (hidden 64, 4 heads, 2 KV heads, 2 layers) and a
  word-level tokenizer trained on :data:`CORPUS` to one directory, as ``save_pretrained`` does.
* :func:`run_sft` trains TRL's ``SFTTrainer`` on that directory and returns what the test compares:
  the logged losses, the collated batches (shape, device, real tokens) and how the trainer
  treated the model. It runs in the test process (the single-device reference) and, through
  ``python -m torch.distributed.run ... _sft_fixtures.py OUT_DIR SPEC``, on every rank of a
  distributed run, where each rank writes its result to ``OUT_DIR/rank{N}.json``.

No hub access: the model is built from a config, the tokenizer is trained on the corpus.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")

__all__ = ["CORPUS", "SEED", "STEPS", "GLOBAL_BATCH", "run_sft", "save_checkpoint"]

SEED = 17
STEPS = 4
GLOBAL_BATCH = 4  # examples per optimizer step in every run: per-device batch x data-parallel size

# Sentences of different lengths, so batches really are padded (to 128 on neuron).
CORPUS: tuple[str, ...] = (
    "the neuron core runs the model",
    "a small language model learns to predict the next word in a sentence",
    "training on two cores matches training on one core",
    "tensor parallel training splits each layer across cores",
    "fully sharded data parallel training splits the parameters and the batch",
    "each core has its own memory",
    "the compiler turns one graph into one program per input shape",
    "the tokenizer maps words to ids and ids back to words",
    "losses must match the single device run",
    "the trainer must not wrap a model that is already distributed",
    "batches are padded to a multiple of one hundred and twenty eight",
    "a seed fixes the weights and the data order",
    "gradients are reduced across the data parallel ranks",
    "the optimizer updates every shard of every parameter",
    "short text",
    "the learning rate is small and the model is tiny so the run is quick",
)


def build_tokenizer(corpus: tuple[str, ...] = CORPUS) -> Any:
    """A word-level ``PreTrainedTokenizerFast`` trained on ``corpus`` (pad 0, bos 1, eos 2, unk 3)."""
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tokenizer = Tokenizer(models.WordLevel(unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenizer.train_from_iterator(corpus, trainers.WordLevelTrainer(special_tokens=["<pad>", "<s>", "</s>", "<unk>"]))
    return PreTrainedTokenizerFast(
        tokenizer_object=tokenizer, pad_token="<pad>", bos_token="<s>", eos_token="</s>", unk_token="<unk>",
    )


def save_checkpoint(directory: str | os.PathLike[str], seed: int = SEED) -> str:
    """Saves a tiny random Llama and the local tokenizer to ``directory``; returns it as a string."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    tokenizer = build_tokenizer()
    config = LlamaConfig(
        hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
        vocab_size=len(tokenizer), max_position_embeddings=256, attention_dropout=0.0,
        pad_token_id=tokenizer.pad_token_id, bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id,
    )
    torch.manual_seed(seed)
    LlamaForCausalLM(config).save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    return os.fspath(directory)


class RecordingCollator:
    """Wraps the trainer's data collator and records every collated batch it returns."""

    def __init__(self, collator: Any) -> None:
        self.collator = collator
        self.batches: list[dict[str, Any]] = []

    def __call__(self, examples: list[dict[str, Any]]) -> dict[str, Any]:
        batch = self.collator(examples)
        ids, mask = batch["input_ids"], batch["attention_mask"]
        self.batches.append({
            "shape": list(ids.shape),
            "real_tokens": [row[m.bool()].tolist() for row, m in zip(ids, mask)],
        })
        return batch


def _wrapping_facts(trainer: Any) -> dict[str, Any]:
    """How the trainer holds the model after training: wrapped again or not, sharded or not."""
    from torch.distributed.tensor import DTensor
    from torch.nn.parallel import DistributedDataParallel

    model = trainer.model
    params = list(model.parameters())
    return {
        "distributed_by_transformers": bool(getattr(trainer, "is_distributed_loading_by_transformers", False)),
        "model_wrapped_is_model": trainer.model_wrapped is model,
        "wrapped_type": type(trainer.model_wrapped).__name__,
        "model_type": type(model).__name__,
        "dtensor_params": sum(isinstance(p, DTensor) for p in params),
        "params": len(params),
        "param_devices": sorted({str(getattr(p, "to_local", lambda: p)().device) for p in params}),
        "param_mesh_dims": sorted({tuple(p.device_mesh.mesh_dim_names or ()) for p in params if isinstance(p, DTensor)}),
        "accelerate_fsdp": bool(trainer.is_fsdp_enabled),
        "ddp_modules": sum(isinstance(m, DistributedDataParallel) for m in (trainer.model_wrapped, *model.modules())),
        "distributed_type": str(trainer.accelerator.distributed_type.value),
    }


def run_sft(
    checkpoint: str, output_dir: str, per_device_batch: int, distributed: dict[str, int] | None = None,
) -> dict[str, Any]:
    """Trains ``STEPS`` steps of SFT on ``checkpoint`` and returns the figures the test compares.

    ``distributed``: ``DistributedConfig`` keyword arguments (e.g. ``{"tp_size": 2}``), passed through
    ``SFTConfig(model_init_kwargs={"distributed_config": ...})``; ``None`` for a single-device run.
    """
    import torch
    from accelerate.state import AcceleratorState
    from datasets import Dataset
    from transformers.distributed import DistributedConfig
    from trl import SFTConfig, SFTTrainer

    AcceleratorState._reset_state(reset_partial_state=True)
    init_kwargs = {} if distributed is None else {"distributed_config": DistributedConfig(**distributed)}
    args = SFTConfig(
        output_dir=output_dir, per_device_train_batch_size=per_device_batch, max_steps=STEPS, learning_rate=5e-3,
        lr_scheduler_type="constant", logging_steps=1, seed=SEED, data_seed=SEED, bf16=False,
        train_sampling_strategy="sequential",  # the same data order in every run
        save_strategy="no", save_only_model=True,  # upstream: no resumable checkpoints for DistributedConfig models
        report_to=[], disable_tqdm=True, dataloader_num_workers=0, max_length=64, model_init_kwargs=init_kwargs,
    )
    dataset = Dataset.from_dict({"text": list(CORPUS)})
    trainer = SFTTrainer(model=checkpoint, args=args, train_dataset=dataset, processing_class=build_tokenizer())
    recorder = RecordingCollator(trainer.data_collator)
    trainer.data_collator = recorder
    fed: list[dict[str, Any]] = []

    def record_fed(module: torch.nn.Module, args: tuple, kwargs: dict[str, Any]) -> None:
        ids = kwargs["input_ids"]
        fed.append({"shape": list(ids.shape), "device": str(ids.device)})

    handle = trainer.model.register_forward_pre_hook(record_fed, with_kwargs=True)
    trainer.train()
    handle.remove()
    history = trainer.state.log_history
    return {
        "losses": [e["loss"] for e in history if "loss" in e],
        "grad_norms": [float(e["grad_norm"]) for e in history if "grad_norm" in e],
        "pad_to_multiple_of": trainer.args.pad_to_multiple_of,
        "device": str(trainer.args.device),
        "collated": recorder.batches,
        "fed": fed,
        "wrapping": _wrapping_facts(trainer),
    }


def _worker(out_dir: Path, spec: dict[str, Any]) -> None:
    """One rank of a distributed run: trains, then writes ``rank{RANK}.json`` (or the error) to ``out_dir``."""
    import traceback

    rank = int(os.environ["RANK"])
    try:
        result: dict[str, Any] = {"ok": True, **run_sft(
            spec["checkpoint"], str(out_dir / "trainer"), spec["per_device_batch"], spec["distributed"],
        )}
    except BaseException:  # noqa: BLE001 - reported to the test, which fails with it
        result = {"ok": False, "error": traceback.format_exc()}
    (out_dir / f"rank{rank}.json").write_text(json.dumps(result))
    if not result["ok"]:
        sys.exit(1)


if __name__ == "__main__":
    _worker(Path(sys.argv[1]), json.loads(sys.argv[2]))
