#!/usr/bin/env python
"""SFT throughput with TRL's ``SFTTrainer``: real (unpadded) tokens per second, three ways, one run.

* **cpu eager**: ``SFTConfig(use_cpu=True)``; no padding beyond what the batch needs.
* **neuron eager**: the same on one emulated NeuronCore; TRL pads the batches to a multiple of 128.
* **neuron-nopad** (diagnostic, no goal): neuron eager with ``pad_to_multiple_of=1``, padded like
  the CPU run: the device layer's own cost, without the padding's.
* **neuron compiled**: ``SFTConfig(torch_compile=True)``; the Trainer compiles the model with backend
  "neuron" (``TrainingArguments`` picks it for the device); padded to multiples of 128, so a few
  shapes (graphs) serve the whole run.

Packing (default ``--packing bfd``): TRL packs the ~20-token examples into ``max_length`` bins and
flattens each batch into one padding-free row, as SFT on fixed-shape hardware is usually run;
neuron pads that row to a multiple of 128 (8% of the tokens here). ``--packing none`` pads every
example's batch instead (7x the real tokens on neuron).

Same model (a random Llama built from a config, by ``examples/sft_demo.py``'s ``save_base_model``),
same data (``examples/data/sft_demo.jsonl``, prompt/completion pairs, the demo's byte-level BPE
tokenizer), same seed and data order. A collator wrapper records the batches the trainer is fed;
*real tokens* are the examples' own tokens (prompt and completion, no padding). Throughput is
real tokens over the wall time from the end of warm-up step ``--warmup`` to the end of the last step
(data loading, forward, backward, optimizer, logging: everything the user waits for). *Steady*
throughput leaves out the timed steps that compiled a new graph (a shape first seen after warm-up).

Goals (issue 5): neuron compiled >= CPU eager (the padding to 128 is paid back by compilation);
neuron eager within 1.15x of CPU eager, i.e. ``cpu / neuron eager`` tokens/s <= 1.15.

    .venv/bin/python bench/sft.py --threads 1        # ~2-4 minutes (compilation included)
    .venv/bin/python bench/sft.py --threads 1 --packing none --max-length 64   # unpacked: padding dominates
    .venv/bin/python bench/sft.py --steps 20 --warmup 3 --only cpu,neuron
    .venv/bin/python bench/sft.py --json /tmp/sft.json

Compiled graphs go to a fresh temporary ``TORCH_NEURONX_NEFF_CACHE_DIR`` unless ``--cache-dir`` names one.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import sys
import tempfile
import time
import warnings
from pathlib import Path
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "examples"))
import sft_demo  # noqa: E402  - the demo's data, tokenizer and model builders

VARIANTS = ("cpu", "neuron", "neuron-compiled", "neuron-nopad")
GOAL_COMPILED_VS_CPU = 1.0  # neuron compiled tokens/s / CPU eager tokens/s >=
GOAL_EAGER_SLOWDOWN = 1.15  # CPU eager tokens/s / neuron eager tokens/s <=


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("--steps", type=int, default=40, help="optimizer steps per variant, warm-up included")
    parser.add_argument("--warmup", type=int, default=5, help="steps excluded from the timing")
    parser.add_argument("--batch", type=int, default=8, help="examples per step")
    parser.add_argument("--hidden", type=int, default=128)
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--kv-heads", type=int, default=2)
    parser.add_argument("--vocab", type=int, default=1024)
    parser.add_argument("--max-length", type=int, default=128, help="SFTConfig.max_length (the packing bin size)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--packing", choices=("none", "bfd", "wrapped"), default="bfd",
                        help="SFTConfig packing for every variant: 'bfd' packs examples into max_length bins and "
                             "flattens each batch into one padding-free row (attention kept per example through "
                             "position_ids); 'wrapped' cuts the token stream into max_length blocks")
    parser.add_argument("--only", default=",".join(VARIANTS), help=f"comma-separated subset of {VARIANTS}")
    parser.add_argument("--cache-dir", default=None, help="TORCH_NEURONX_NEFF_CACHE_DIR to use (default: fresh temp)")
    parser.add_argument("--threads", type=int, default=None, help="torch.set_num_threads for every variant (default: torch's)")
    parser.add_argument("--report", action="store_true", help="print neuron_compile's metrics report after the compiled run")
    parser.add_argument("--json", default=None, help="write the figures to this file")
    args = parser.parse_args(argv)
    args.only = [v.strip() for v in args.only.split(",") if v.strip()]
    unknown = set(args.only) - set(VARIANTS)
    if unknown:
        parser.error(f"--only: unknown variants {sorted(unknown)}; choose from {VARIANTS}")
    if not 0 <= args.warmup < args.steps:
        parser.error("--warmup must be >= 0 and < --steps")
    return args


class CountingCollator:
    """Wraps the trainer's collator; records, per batch, its padded shape and its real tokens."""

    def __init__(self, collator: Any) -> None:
        self.collator = collator
        self.batches: list[dict[str, Any]] = []

    def __call__(self, examples: list[dict[str, Any]]) -> dict[str, Any]:
        batch = self.collator(examples)
        self.batches.append({
            "shape": tuple(batch["input_ids"].shape),
            # The examples' own tokens (already truncated to max_length): with or without packing.
            "real_tokens": sum(len(example["input_ids"]) for example in examples),
            "loss_tokens": int((batch["labels"] != -100).sum()),
        })
        return batch


def _step_clock() -> Any:
    from transformers import TrainerCallback

    import neuron_compile.metrics

    class StepClock(TrainerCallback):
        """``perf_counter`` at the start of training and at the end of every optimizer step, and the
        number of compiled graphs at each of those points (a step that added one compiled it)."""

        def __init__(self) -> None:
            self.start = 0.0
            self.graphs_at_start = 0
            self.ends: list[float] = []
            self.graphs: list[int] = []

        def on_train_begin(self, args, state, control, **kwargs):  # noqa: ANN001 - Trainer's callback API
            self.start = time.perf_counter()
            self.graphs_at_start = neuron_compile.metrics.counters()["graphs"]

        def on_step_end(self, args, state, control, **kwargs):  # noqa: ANN001
            self.ends.append(time.perf_counter())
            self.graphs.append(neuron_compile.metrics.counters()["graphs"])

    return StepClock()


def run_variant(name: str, base: str, args: argparse.Namespace, workdir: str) -> dict[str, Any]:
    import torch
    from accelerate.state import AcceleratorState
    from datasets import Dataset
    from transformers import AutoTokenizer
    from transformers.trainer_callback import PrinterCallback
    from trl import SFTConfig, SFTTrainer

    import neuron_compile.metrics

    AcceleratorState._reset_state(reset_partial_state=True)
    os.environ.pop("ACCELERATE_DYNAMO_BACKEND", None)  # exported by an earlier torch_compile=True run
    torch._dynamo.reset()
    neuron_compile.metrics.reset()
    config = SFTConfig(
        output_dir=os.path.join(workdir, name), use_cpu=name == "cpu", torch_compile=name == "neuron-compiled",
        max_steps=args.steps, per_device_train_batch_size=args.batch, learning_rate=3e-3,
        lr_scheduler_type="constant", weight_decay=0.0, logging_steps=10, seed=args.seed, data_seed=args.seed,
        bf16=False, max_length=args.max_length, **({"pad_to_multiple_of": 1} if name == "neuron-nopad" else {}), gradient_checkpointing=False, save_strategy="no",
        report_to=[], disable_tqdm=True, dataloader_num_workers=0,
        packing=args.packing != "none", **({"packing_strategy": args.packing} if args.packing != "none" else {}),
        dataloader_drop_last=True,  # 299 examples: no short last batch, so no second compiled graph mid-run
    )
    trainer = SFTTrainer(model=base, args=config, train_dataset=Dataset.from_list(sft_demo.load_examples()),
                         processing_class=AutoTokenizer.from_pretrained(base))
    counter = CountingCollator(trainer.data_collator)
    trainer.data_collator = counter
    clock = _step_clock()
    trainer.add_callback(clock)
    trainer.remove_callback(PrinterCallback)  # the end-of-training metrics dict; the bench prints its own line
    trainer.train()

    device = str(next(trainer.model.parameters()).device)
    assert len(clock.ends) == args.steps, (len(clock.ends), args.steps)
    # Step i consumed batch i (no gradient accumulation); the data loader may have collated one more.
    fed = counter.batches[:args.steps]
    timed = fed[args.warmup:]
    seconds = clock.ends[-1] - (clock.ends[args.warmup - 1] if args.warmup else clock.start)
    real = sum(b["real_tokens"] for b in timed)
    # Steady state: the timed steps that compiled no new graph (a new shape after warm-up compiles
    # mid-run; that one-off cost is in `tokens_per_s` and left out of `steady_tokens_per_s`).
    starts = [clock.start, *clock.ends[:-1]]
    before = [clock.graphs_at_start, *clock.graphs[:-1]]
    steady = [i for i in range(args.warmup, args.steps) if clock.graphs[i] == before[i]]
    steady_seconds = sum(clock.ends[i] - starts[i] for i in steady)
    steady_real = sum(fed[i]["real_tokens"] for i in steady)
    padded = sum(b["shape"][0] * b["shape"][1] for b in timed)
    counters = neuron_compile.metrics.counters()
    losses = [e["loss"] for e in trainer.state.log_history if "loss" in e]
    result = {
        "variant": name, "device": device, "compile_backend": trainer.args.torch_compile_backend,
        "pad_to_multiple_of": trainer.args.pad_to_multiple_of,
        "timed_steps": len(timed), "seconds": seconds, "real_tokens": real, "padded_tokens": padded,
        "loss_tokens": sum(b["loss_tokens"] for b in timed),
        "tokens_per_s": real / seconds, "ms_per_step": 1000 * seconds / len(timed),
        "compiling_steps": len(timed) - len(steady),
        "steady_tokens_per_s": steady_real / steady_seconds if steady else float("nan"),
        "seq_lengths": sorted({b["shape"][1] for b in timed}),
        "warmup_seconds": (clock.ends[args.warmup - 1] - clock.start) if args.warmup else 0.0,
        "graphs": counters["graphs"], "compilations": counters["compilations"],
        "eager_fallbacks": counters["eager_fallbacks"], "compile_seconds": counters["compile_seconds_total"],
        "graph_breaks": counters["graph_breaks"], "losses": losses,
    }
    if args.report and name == "neuron-compiled":
        print(neuron_compile.metrics.report())
    del trainer
    return result


def _uptime() -> str:
    try:
        return " ".join(Path("/proc/loadavg").read_text().split()[:3])
    except OSError:
        return "?"


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    warnings.filterwarnings("ignore", category=UserWarning)
    warnings.filterwarnings("ignore", category=FutureWarning)
    workdir = tempfile.mkdtemp(prefix="bench_sft_")
    cache_dir = args.cache_dir or os.path.join(workdir, "neff_cache")
    os.environ["TORCH_NEURONX_NEFF_CACHE_DIR"] = cache_dir
    import datasets
    import torch
    import transformers

    import neuron_compile.cache
    import torch_neuronx  # noqa: F401 - the neuron device and backend

    neuron_compile.cache.default_cache.cache_clear()
    if args.threads:
        torch.set_num_threads(args.threads)
    datasets.disable_progress_bars()
    transformers.logging.set_verbosity_error()
    transformers.logging.disable_progress_bar()

    start_load = _uptime()
    print(f"bench/sft.py: {platform.node()}, {os.cpu_count()} cpus, torch {torch.__version__}, "
          f"transformers {transformers.__version__}, {torch.get_num_threads()} threads; load average {start_load}")
    model_args = argparse.Namespace(hidden=args.hidden, layers=args.layers, heads=args.heads, kv_heads=args.kv_heads,
                                    vocab=args.vocab, seed=args.seed)
    base = os.path.join(workdir, "base")
    results: list[dict[str, Any]] = []
    try:
        sft_demo.save_base_model(base, model_args)
        print(f"model: Llama hidden {args.hidden}, {args.layers} layers, {args.heads} heads ({args.kv_heads} KV), "
              f"vocab {transformers.AutoConfig.from_pretrained(base).vocab_size}; batch {args.batch}, "
              f"max_length {args.max_length}, packing {args.packing}; {args.steps} steps, first {args.warmup} not timed")
        for name in args.only:
            t0 = time.perf_counter()
            r = run_variant(name, base, args, workdir)
            r["load_after"] = _uptime()
            results.append(r)
            print(f"  {name:16s} {r['tokens_per_s']:8.0f} real tokens/s ({r['steady_tokens_per_s']:.0f} in the "
                  f"{r['timed_steps'] - r['compiling_steps']} steps that compiled nothing)  {r['ms_per_step']:7.1f} ms/step  "
                  f"seq {r['seq_lengths'][0]}-{r['seq_lengths'][-1]}  real/padded {r['real_tokens']}/{r['padded_tokens']}"
                  f"  graphs {r['graphs']} (compile {r['compile_seconds']:.0f} s)  warm-up {r['warmup_seconds']:.0f} s"
                  f"  total {time.perf_counter() - t0:.0f} s  load {r['load_after']}", flush=True)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)

    by = {r["variant"]: r for r in results}
    print()
    print("| variant | device | real tokens/s | steady tokens/s | ms/step | seq lengths | real / padded tokens | graphs "
          "| compile s |")
    print("| --- | --- | ---: | ---: | ---: | --- | ---: | ---: | ---: |")
    for r in results:
        seq = f"{r['seq_lengths'][0]}-{r['seq_lengths'][-1]}" if len(r["seq_lengths"]) > 1 else str(r["seq_lengths"][0])
        print(f"| {r['variant']} | {r['device']} | {r['tokens_per_s']:.0f} | {r['steady_tokens_per_s']:.0f} | "
              f"{r['ms_per_step']:.1f} | {seq} | "
              f"{r['real_tokens']} / {r['padded_tokens']} | {r['graphs']} | {r['compile_seconds']:.0f} |")
    ratios: dict[str, float] = {}
    if "cpu" in by and "neuron-compiled" in by:
        ratios["compiled_vs_cpu"] = by["neuron-compiled"]["tokens_per_s"] / by["cpu"]["tokens_per_s"]
        ok = ratios["compiled_vs_cpu"] >= GOAL_COMPILED_VS_CPU
        print(f"\nneuron compiled / CPU eager tokens/s = {ratios['compiled_vs_cpu']:.2f} "
              f"(goal >= {GOAL_COMPILED_VS_CPU}): {'MET' if ok else 'MISS'}")
        ratios["compiled_vs_cpu_steady"] = by["neuron-compiled"]["steady_tokens_per_s"] / by["cpu"]["steady_tokens_per_s"]
        ok = ratios["compiled_vs_cpu_steady"] >= GOAL_COMPILED_VS_CPU
        print(f"  the same without the timed steps that compiled a new shape = "
              f"{ratios['compiled_vs_cpu_steady']:.2f}: {'MET' if ok else 'MISS'}")
    if "cpu" in by and "neuron" in by:
        ratios["cpu_vs_eager"] = by["cpu"]["tokens_per_s"] / by["neuron"]["tokens_per_s"]
        ok = ratios["cpu_vs_eager"] <= GOAL_EAGER_SLOWDOWN
        print(f"CPU eager / neuron eager tokens/s = {ratios['cpu_vs_eager']:.2f} "
              f"(goal <= {GOAL_EAGER_SLOWDOWN}): {'MET' if ok else 'MISS'}")
    if "neuron" in by and "neuron-compiled" in by:
        ratios["compiled_vs_eager"] = by["neuron-compiled"]["tokens_per_s"] / by["neuron"]["tokens_per_s"]
        print(f"neuron compiled / neuron eager tokens/s = {ratios['compiled_vs_eager']:.2f}")
    if "cpu" in by and "neuron-nopad" in by:
        ratios["cpu_vs_eager_nopad"] = by["cpu"]["tokens_per_s"] / by["neuron-nopad"]["tokens_per_s"]
        print(f"CPU eager / neuron eager unpadded tokens/s = {ratios['cpu_vs_eager_nopad']:.2f} (diagnostic)")
    print(f"load average at start {start_load}, at end {_uptime()}")
    if args.json:
        Path(args.json).write_text(json.dumps({"args": vars(args), "results": results, "ratios": ratios,
                                               "load_start": start_load}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
