"""Demo: fine-tune a small causal LM with TRL's SFTTrainer on 2 emulated NeuronCores (tensor parallel).

    python examples/sft_demo.py                       # 2 cores, tensor parallel, defaults below
    python examples/sft_demo.py --cores 4 --tp 2 --fsdp 2 --steps 120 --hidden 256 --layers 4

What it does, as a user would on Trainium, with nothing but the device changed:

1. Builds a byte-level BPE tokenizer from ``examples/data/sft_demo.jsonl`` (299 question/answer
   pairs written by ``examples/data/make_sft_demo.py``; nothing is downloaded) and a small Llama
   from a config with random weights, saved with ``save_pretrained``.
2. Trains it with ``SFTTrainer`` under torchrun, one process per NeuronCore: the script re-launches
   itself with ``torch.distributed.run`` when it is not already under torchrun. TRL loads the model
   with ``SFTConfig(model_init_kwargs={"distributed_config": DistributedConfig(tp_size, fsdp_size)})``,
   so transformers shards it (tensor parallel by default, FSDP2 with ``--fsdp``) and the Trainer
   uses it as is; batches are padded to a multiple of 128, as TRL does on neuron. Trainer's
   progress bar shows the loss.
3. Saves the trained model (``save_model`` gathers the shards) and, on one core, generates answers
   greedily with the static cache (``cache_implementation="static"``), which transformers compiles
   with ``torch.compile(backend="neuron")``.
4. Prints the loss curve, the answers, and ``torch_neuronx.metrics.report()`` (graphs compiled,
   compile-cache hits, memory per core) with every rank's peak memory.

Training runs eagerly; only generation is compiled. ``--compile`` sets ``SFTConfig(torch_compile=True)``
(the Trainer then compiles forward and backward with backend "neuron", ``dynamic=False``), but with
tensor parallelism the neuron compiler currently rejects the DTensor graph ("aten.embedding.default
got mixed torch.Tensor and DTensor", NeuronCompileError), so the flag is off by default (it is for
trying ``--cores 1`` or a later compiler). Compiled generation takes about a minute the first time; the compile cache persists across runs
(``TORCH_NEURONX_NEFF_CACHE_DIR``), so a second run loads the graph from disk in seconds.

The default run (120 steps, hidden 128, 2 layers) takes about 3-5 minutes on a busy 2-core
machine; the loss falls from about 7 to below 1. Such a small model learns the answer formats
first and the facts only later: expect fluent but often wrong answers (try ``--steps 600``).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

DATA = Path(__file__).resolve().parent / "data" / "sft_demo.jsonl"
QUESTIONS = (
    "What is the capital of France?",
    "What is the opposite of hot?",
    "What is three plus four?",
    "What sound does a cow make?",
)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("--cores", type=int, default=2, help="NeuronCores = torchrun processes")
    parser.add_argument("--tp", type=int, default=None, help="tensor parallel size (default: cores / fsdp)")
    parser.add_argument("--fsdp", type=int, default=1, help="FSDP (data parallel) size")
    parser.add_argument("--steps", type=int, default=120, help="optimizer steps")
    parser.add_argument("--batch", type=int, default=16, help="global batch (per-core batch x FSDP size)")
    parser.add_argument("--lr", type=float, default=3e-3, help="peak learning rate (cosine decay)")
    parser.add_argument("--hidden", type=int, default=128, help="model hidden size")
    parser.add_argument("--layers", type=int, default=2, help="decoder layers")
    parser.add_argument("--heads", type=int, default=4, help="attention heads")
    parser.add_argument("--kv-heads", type=int, default=2, help="key/value heads")
    parser.add_argument("--vocab", type=int, default=1024, help="tokenizer vocabulary budget")
    parser.add_argument("--max-new-tokens", type=int, default=12, help="tokens generated per answer")
    parser.add_argument("--compile", action="store_true", help="also compile training (SFTConfig(torch_compile=True))")
    parser.add_argument("--bf16", action="store_true", help="bf16 autocast (default: fp32)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--workdir", default=None, help=argparse.SUPPRESS)  # set by the launcher
    args = parser.parse_args(argv)
    if args.tp is None:
        args.tp = max(args.cores // args.fsdp, 1)
    if args.tp * args.fsdp != args.cores:
        parser.error(f"--tp {args.tp} x --fsdp {args.fsdp} must equal --cores {args.cores}")
    if args.batch % args.fsdp:
        parser.error(f"--batch {args.batch} must be a multiple of --fsdp {args.fsdp}")
    return args


# ----------------------------------------------------------------------------- launcher


def _under_torchrun() -> bool:
    return "TORCHELASTIC_RUN_ID" in os.environ or "LOCAL_RANK" in os.environ


def launch(args: argparse.Namespace, argv: list[str]) -> int:
    """Runs this script on ``args.cores`` processes under torchrun (or in this process for 1 core)."""
    workdir = tempfile.mkdtemp(prefix="sft_demo_")
    env = os.environ | {"OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1"), "HF_HUB_OFFLINE": "1",
                        "TOKENIZERS_PARALLELISM": "false"}
    cmd = [sys.executable, *(["-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={args.cores}"]
                             if args.cores > 1 else []), str(Path(__file__).resolve()), *argv, "--workdir", workdir]
    start = time.perf_counter()
    try:
        code = subprocess.call(cmd, env=env)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    print(f"\nsft_demo: {'done' if code == 0 else f'failed (exit {code})'} in {time.perf_counter() - start:.0f} s")
    return code


# ----------------------------------------------------------------------------- data, tokenizer, model


def load_examples() -> list[dict[str, str]]:
    with DATA.open() as lines:
        return [json.loads(line) for line in lines if line.strip()]


def build_tokenizer(texts: list[str], vocab: int) -> Any:
    """A byte-level BPE tokenizer trained on ``texts`` (pad, bos and eos are special tokens)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.train_from_iterator(texts, trainers.BpeTrainer(
        vocab_size=vocab, special_tokens=["<pad>", "<s>", "</s>"], initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    ))
    return PreTrainedTokenizerFast(tokenizer_object=tokenizer, pad_token="<pad>", bos_token="<s>", eos_token="</s>")


def save_base_model(directory: str, args: argparse.Namespace) -> None:
    """Writes the tokenizer and a randomly initialised small Llama to ``directory``."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    examples = load_examples()
    tokenizer = build_tokenizer([e["prompt"] + e["completion"] for e in examples], args.vocab)
    config = LlamaConfig(
        hidden_size=args.hidden, intermediate_size=2 * args.hidden, num_hidden_layers=args.layers,
        num_attention_heads=args.heads, num_key_value_heads=args.kv_heads,
        vocab_size=64 * math.ceil(len(tokenizer) / 64),  # a multiple of 64: shards evenly over the cores
        max_position_embeddings=256, pad_token_id=tokenizer.pad_token_id, bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
    )
    torch.manual_seed(args.seed)
    LlamaForCausalLM(config).save_pretrained(directory)
    tokenizer.save_pretrained(directory)


# ----------------------------------------------------------------------------- training


def _quiet_libraries() -> None:
    import warnings

    import datasets
    import transformers

    datasets.disable_progress_bars()
    transformers.logging.set_verbosity_error()
    transformers.logging.disable_progress_bar()  # weight loading bars; Trainer's own bar stays
    warnings.filterwarnings("ignore", category=UserWarning)
    warnings.filterwarnings("ignore", category=FutureWarning)


def _loss_progress_callback() -> Any:
    from transformers.trainer_callback import ProgressCallback

    class LossProgress(ProgressCallback):
        """Trainer's tqdm bar, with the latest loss in the bar instead of a printed line per log."""

        def on_log(self, args, state, control, logs=None, **kwargs):  # noqa: ANN001 - Trainer's callback API
            if state.is_world_process_zero and self.training_bar is not None and logs and "loss" in logs:
                self.training_bar.set_postfix(loss=f"{logs['loss']:.3f}", refresh=False)

    return LossProgress


def train(args: argparse.Namespace, base: str) -> Any:
    """SFT on the demo data; returns the trainer."""
    from datasets import Dataset
    from transformers import AutoTokenizer
    from transformers.distributed import DistributedConfig
    from transformers.trainer_callback import PrinterCallback, ProgressCallback
    from trl import SFTConfig, SFTTrainer

    init_kwargs = {} if args.cores == 1 else {
        "distributed_config": DistributedConfig(tp_size=args.tp, fsdp_size=args.fsdp)}
    config = SFTConfig(
        output_dir=os.path.join(args.workdir, "trainer"), max_steps=args.steps,
        per_device_train_batch_size=args.batch // args.fsdp, learning_rate=args.lr, lr_scheduler_type="cosine",
        warmup_steps=max(args.steps // 20, 1), weight_decay=0.0, logging_steps=1, seed=args.seed,
        bf16=args.bf16, torch_compile=args.compile, max_length=64, model_init_kwargs=init_kwargs,
        gradient_checkpointing=False,  # TRL's default recomputes activations: no memory to save on this model
        save_strategy="no", save_only_model=True,  # upstream: no resumable checkpoints for sharded-at-load models
        report_to=[], dataloader_num_workers=0, disable_tqdm=False,  # the bar even with quiet logging
    )
    trainer = SFTTrainer(model=base, args=config, train_dataset=Dataset.from_list(load_examples()),
                         processing_class=AutoTokenizer.from_pretrained(base))
    trainer.remove_callback(ProgressCallback)
    trainer.remove_callback(PrinterCallback)
    trainer.add_callback(_loss_progress_callback())
    trainer.train()
    return trainer


# ----------------------------------------------------------------------------- reporting


def loss_curve(losses: list[float], rows: int = 15, width: int = 44) -> str:
    """A text plot: each row is the mean loss over a run of consecutive steps, drawn as a bar."""
    per_row = max(math.ceil(len(losses) / rows), 1)
    spans = [(i, losses[i:i + per_row]) for i in range(0, len(losses), per_row)]
    means = [sum(chunk) / len(chunk) for _, chunk in spans]
    low, high = min(means), max(means)
    lines = ["loss curve (mean loss over each span of steps):"]
    for (start, chunk), mean in zip(spans, means):
        bar = "#" * max(round(width * (mean - low) / (high - low or 1.0)), 1)
        lines.append(f"  steps {start + 1:4d}-{start + len(chunk):<4d} {mean:7.3f} {bar}")
    lines.append(f"  first step {losses[0]:.3f} -> last step {losses[-1]:.3f}")
    return "\n".join(lines)


def generate_answers(model_dir: str, questions: tuple[str, ...], max_new_tokens: int) -> tuple[list[str], list[float]]:
    """Greedy answers with the static cache on this process's core, and the seconds of two identical calls."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_dir, padding_side="left")
    device = torch.device("neuron", torch.neuron.current_device())
    model = AutoModelForCausalLM.from_pretrained(model_dir, device_map=device).eval()
    # One batch, left-padded: one prompt shape and one static cache size, so one compiled decoding graph.
    inputs = tokenizer([f"Q: {q} A:" for q in questions], return_tensors="pt", padding=True).to(device)
    seconds = []
    for _ in range(2):  # the first call compiles (or loads from the compile cache), the second reuses it
        start = time.perf_counter()
        with torch.no_grad():
            out = model.generate(**inputs, max_new_tokens=max_new_tokens, do_sample=False,
                                 cache_implementation="static", pad_token_id=tokenizer.pad_token_id)
        seconds.append(time.perf_counter() - start)
    answers = tokenizer.batch_decode(out[:, inputs["input_ids"].shape[1]:], skip_special_tokens=True)
    return [a.strip() for a in answers], seconds


def memory_line(rank: int) -> dict[str, Any]:
    import torch

    return {"rank": rank, "core": torch.neuron.current_device(), "peak": torch.neuron.max_memory_allocated(),
            "allocated": torch.neuron.memory_allocated()}


def print_summary(args: argparse.Namespace, trainer: Any, memory: list[dict[str, Any]], train_seconds: float) -> None:
    losses = [e["loss"] for e in trainer.state.log_history if "loss" in e]
    layout = f"tp={args.tp}, fsdp={args.fsdp}" if args.cores > 1 else "one core"
    print(f"\ntrained {args.steps} steps on {args.cores} NeuronCore(s) ({layout}) in {train_seconds:.0f} s, "
          f"{'compiled' if args.compile else 'eager'}, batches padded to {trainer.args.pad_to_multiple_of}")
    print(loss_curve(losses))
    print("peak memory per core during training:")
    for m in memory:
        print(f"  rank {m['rank']} on neuron:{m['core']}: peak {m['peak'] / 2**20:.1f} MiB, "
              f"now {m['allocated'] / 2**20:.1f} MiB")


# ----------------------------------------------------------------------------- main


def run(args: argparse.Namespace) -> None:
    """One process (rank) of the demo."""
    _quiet_libraries()
    import torch
    from accelerate import PartialState
    from accelerate.utils import gather_object

    import torch_neuronx

    state = PartialState()
    base, final = os.path.join(args.workdir, "base"), os.path.join(args.workdir, "final")
    if state.is_main_process:
        props = torch.neuron.get_device_properties(0)
        print(f"emulated {props.instance}: {torch.neuron.device_count()} x {props.name}; "
              f"training on {args.cores} core(s), {len(load_examples())} examples from {DATA.name}")
        save_base_model(base, args)
    state.wait_for_everyone()
    start = time.perf_counter()
    trainer = train(args, base)
    train_seconds = time.perf_counter() - start
    memory = gather_object([memory_line(state.process_index)])
    trainer.save_model(final)  # every rank: the shards are gathered into one checkpoint
    state.wait_for_everyone()
    if not state.is_main_process:
        return
    print_summary(args, trainer, memory, train_seconds)
    del trainer
    answers, seconds = generate_answers(final, QUESTIONS, args.max_new_tokens)
    print(f"\ngreedy answers, static cache compiled with backend 'neuron' "
          f"(first generate {seconds[0]:.1f} s with compilation, second {seconds[1]:.2f} s):")
    for question, answer in zip(QUESTIONS, answers):
        print(f"  Q: {question}\n  A: {answer}")
    print()
    print(torch_neuronx.metrics.report())


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    args = parse_args(argv)
    if args.workdir is None and not _under_torchrun():
        return launch(args, argv)
    if args.workdir is None:  # started by torchrun directly: every rank must agree on one directory
        args.workdir = os.path.join(tempfile.gettempdir(), f"sft_demo_{os.environ.get('TORCHELASTIC_RUN_ID', 'run')}")
    run(args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
