#!/usr/bin/env python
"""``torch.compile(backend="neuron")`` against eager and CPU Inductor, in one run.

Four parts (see bench/README.md and bench/RESULTS.md):

* **train**: the time of one training step (forward, backward, SGD) of a Llama-style model
  built from a ``LlamaConfig`` (no hub), for CPU eager, neuron eager, neuron compiled
  (``backend="neuron"``) and CPU Inductor (``torch.compile``'s default backend on the CPU), at
  a *small* size where per-op overhead dominates and a *large* size where matrix multiplies
  dominate. The variants are timed round-robin (one step each per round, the order rotating),
  so drifting load hits all of them alike; a row reports the median step over the rounds, its
  quartiles and the fastest step. The large rounds also time one fp32 ``torch.mm`` of 2048^3
  on the CPU, the machine's matrix-multiply rate measured under the same load, against which
  the compiled step's rate (6 x parameters x tokens FLOPs per step) is compared.
* **startup**: cold compile vs. warm cache in fresh processes (subprocesses of this script):
  seconds from launch to the end of the first compiled training step (small size). Cold: empty
  ``TORCH_NEURONX_NEFF_CACHE_DIR`` and empty ``TORCHINDUCTOR_CACHE_DIR``; warm: the cold run's
  NEFF cache, a fresh, empty ``TORCHINDUCTOR_CACHE_DIR`` (the neuron cache alone does the work).
* **buckets**: graphs compiled for 200 random lengths in 1..2048 (tiny model, inference under
  ``torch.no_grad``) with ``BucketedCausalLM`` and the default policy (multiples of 128 up to
  2048), and without buckets on a documented subset of the lengths (a graph takes 10-40 s to
  compile here; one graph per distinct length is checked on the subset and counted exactly
  for the 200).
* the fp32 matrix-multiply rate alone at the start (1024^3 and 2048^3), for reference.

    .venv/bin/python bench/compile.py             # full run (over an hour on 2 overloaded cores)
    .venv/bin/python bench/compile.py --quick     # fewer rounds, 8 unbucketed lengths
    .venv/bin/python bench/compile.py --skip startup,buckets --json out.json

Every process gets fresh, empty compile caches (temporary directories, removed at the end)
unless ``--cache-dir`` names a directory to keep them in (only for iterating on the bench:
the train part then starts from warm caches; startup children always get fresh ones).
"""

from __future__ import annotations

import argparse
import datetime
import gc
import json
import os
import platform
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

_T_MODULE = time.time()  # child processes: the script's first line ran (after the interpreter started)

DEVICE = "neuron"
GOALS = {
    "small_vs_inductor": 1.0,  # compiled neuron step / CPU Inductor step <=
    "small_vs_eager": 1.5,  # neuron eager step / compiled neuron step >=
    "large_vs_inductor": 1.0,
    "large_mm_fraction": 0.80,  # achieved FLOP/s of the compiled step / torch.mm FLOP/s >=
    "warm_fraction": 0.20,  # warm first-step time / cold first-step time <=
    "bucket_graphs": 16,  # graphs for 200 random lengths with the default policy <=
}
MM_SIDE = 2048


@dataclass(frozen=True)
class Size:
    name: str
    hidden: int
    layers: int
    heads: int
    intermediate: int
    vocab: int
    batch: int
    seq: int

    @property
    def tokens(self) -> int:
        return self.batch * self.seq

    def describe(self) -> str:
        return (f"hidden {self.hidden}, {self.layers} layers, {self.heads} heads (head dim "
                f"{self.hidden // self.heads}), intermediate {self.intermediate}, vocab {self.vocab}, "
                f"batch {self.batch} x seq {self.seq} = {self.tokens} tokens")


SIZES = {
    # Per-op overhead dominates: ~0.1 GFLOP per step, ~100 kernels/ops per step.
    "small": Size("small", hidden=128, layers=2, heads=4, intermediate=512, vocab=1024, batch=1, seq=128),
    # Matrix multiplies dominate: ~125 GFLOP per step (6 x params x tokens).
    "large": Size("large", hidden=512, layers=4, heads=8, intermediate=2048, vocab=4096, batch=2, seq=512),
}
TINY = Size("tiny", hidden=32, layers=1, heads=2, intermediate=64, vocab=256, batch=1, seq=0)
VARIANTS = ("cpu eager", "neuron eager", "neuron compiled", "cpu inductor")


@dataclass
class Settings:
    small_rounds: int
    large_rounds: int
    warmup_steps: int
    nobucket_lengths: int
    startup_warm_runs: int


FULL = Settings(small_rounds=21, large_rounds=9, warmup_steps=3, nobucket_lengths=24, startup_warm_runs=2)
QUICK = Settings(small_rounds=7, large_rounds=3, warmup_steps=2, nobucket_lengths=8, startup_warm_runs=1)


# --------------------------------------------------------------------------------------------
# Models
# --------------------------------------------------------------------------------------------


def _llama(size: Size, seed: int = 0):
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        vocab_size=size.vocab, hidden_size=size.hidden, intermediate_size=size.intermediate,
        num_hidden_layers=size.layers, num_attention_heads=size.heads, num_key_value_heads=size.heads,
        max_position_embeddings=2048, use_cache=False, tie_word_embeddings=False,
        attn_implementation="sdpa",
    )
    torch.manual_seed(seed)
    return LlamaForCausalLM(config)


def _parameters(model) -> tuple[int, int]:
    """(all parameters, parameters that take part in matrix multiplies: all but the input embedding)."""
    total = sum(p.numel() for p in model.parameters())
    embedding = model.get_input_embeddings().weight.numel()
    return total, total - embedding


class Trainer:
    """One variant: a model, its SGD optimizer (for-loop, same on every variant) and its batch."""

    def __init__(self, name: str, base, size: Size, tokens) -> None:
        import copy

        import torch

        self.name = name
        device = "cpu" if name.startswith("cpu") else DEVICE
        self.device = device
        self.model = copy.deepcopy(base).to(device)
        self.opt = torch.optim.SGD(self.model.parameters(), lr=1e-3, foreach=False)
        self.ids = tokens.to(device)
        if name == "neuron compiled":
            self.fn = torch.compile(self.model, backend="neuron")
        elif name == "cpu inductor":
            self.fn = torch.compile(self.model)
        else:
            self.fn = self.model
        self.sync = getattr(torch, DEVICE).synchronize if device == DEVICE else (lambda: None)

    def step(self):
        self.opt.zero_grad(set_to_none=True)
        loss = self.fn(input_ids=self.ids, labels=self.ids).loss
        loss.backward()
        self.opt.step()
        return loss.detach()

    def timed_step(self) -> float:
        t0 = time.perf_counter()
        self.step()
        self.sync()
        return time.perf_counter() - t0


def _mm_seconds(a, b) -> float:
    import torch

    t0 = time.perf_counter()
    torch.mm(a, b)
    return time.perf_counter() - t0


def bench_mm() -> dict[str, Any]:
    """fp32 torch.mm rate on the CPU, alone (the train part measures it again under its load)."""
    import torch

    out: dict[str, Any] = {}
    for side in (1024, MM_SIDE):
        a, b = torch.randn(side, side), torch.randn(side, side)
        for _ in range(2):
            _mm_seconds(a, b)
        times = [_mm_seconds(a, b) for _ in range(7 if side == MM_SIDE else 21)]
        flops = 2 * side**3
        out[str(side)] = {"median_gflops": flops / statistics.median(times) / 1e9,
                          "best_gflops": flops / min(times) / 1e9, "seconds": times}
        print(f"  torch.mm {side}^3 fp32 (cpu, {torch.get_num_threads()} threads): median "
              f"{out[str(side)]['median_gflops']:6.1f} GFLOP/s, best {out[str(side)]['best_gflops']:6.1f} "
              f"GFLOP/s over {len(times)} calls", flush=True)
    return out


def _quartiles(xs: list[float]) -> tuple[float, float]:
    if len(xs) < 2:
        return xs[0], xs[0]
    q = statistics.quantiles(xs, n=4)
    return q[0], q[2]


def bench_train(size: Size, rounds: int, warmup: int) -> dict[str, Any]:
    import torch

    base = _llama(size)
    total, matmul_params = _parameters(base)
    tokens = torch.randint(0, size.vocab, (size.batch, size.seq), generator=torch.Generator().manual_seed(1))
    print(f"\n[{size.name}] {size.describe()}; {total / 1e6:.2f} M parameters "
          f"({matmul_params / 1e6:.2f} M without the input embedding)", flush=True)
    trainers = [Trainer(name, base, size, tokens) for name in VARIANTS]
    # First step: compiles the compiled variants; its loss checks that all four agree.
    first_losses, first_seconds = {}, {}
    for t in trainers:
        t0 = time.perf_counter()
        first_losses[t.name] = t.step().item()
        first_seconds[t.name] = time.perf_counter() - t0
        print(f"  first step {t.name:<16} {first_seconds[t.name]:8.2f} s  loss {first_losses[t.name]:.6f}",
              flush=True)
    ref = first_losses["cpu eager"]
    loss_rel = {k: abs(v - ref) / abs(ref) for k, v in first_losses.items()}
    for t in trainers:
        for _ in range(warmup):
            t.step()
        t.sync()

    mm = None
    if size.name == "large":  # the matrix-multiply rate under the same load, one call per round
        mm = (torch.randn(MM_SIDE, MM_SIDE), torch.randn(MM_SIDE, MM_SIDE))
        _mm_seconds(*mm)
    times: dict[str, list[float]] = {t.name: [] for t in trainers}
    mm_times: list[float] = []
    gc.collect()
    gc.disable()
    try:
        for r in range(rounds):
            order = trainers[r % len(trainers):] + trainers[:r % len(trainers)]
            if r % 2:
                order.reverse()
            for t in order:
                times[t.name].append(t.timed_step())
            if mm is not None:
                mm_times.append(_mm_seconds(*mm))
    finally:
        gc.enable()

    rows = {}
    for name, ts in times.items():
        q1, q3 = _quartiles(ts)
        rows[name] = {"median_s": statistics.median(ts), "q1_s": q1, "q3_s": q3, "min_s": min(ts),
                      "steps_s": ts, "first_step_s": first_seconds[name], "first_loss": first_losses[name],
                      "loss_rel_diff_vs_cpu_eager": loss_rel[name]}

    def pair_ratio(a: str, b: str) -> float:  # median over rounds of (a / b) in the same round
        return statistics.median(x / y for x, y in zip(times[a], times[b]))

    result: dict[str, Any] = {"size": vars(size), "parameters": total, "matmul_parameters": matmul_params,
                              "rounds": rounds, "variants": rows,
                              "compiled_over_inductor": pair_ratio("neuron compiled", "cpu inductor"),
                              "eager_over_compiled": pair_ratio("neuron eager", "neuron compiled"),
                              "cpu_eager_over_compiled": pair_ratio("cpu eager", "neuron compiled"),
                              "neuron_eager_over_cpu_eager": pair_ratio("neuron eager", "cpu eager")}
    flops = 6 * total * size.tokens
    result["flops_per_step"] = flops
    if mm_times:
        mm_flops = 2 * MM_SIDE**3
        result["mm_gflops_median"] = mm_flops / statistics.median(mm_times) / 1e9
        result["mm_gflops_best"] = mm_flops / min(mm_times) / 1e9
        result["mm_seconds"] = mm_times
        for name in VARIANTS:
            rows[name]["gflops"] = flops / rows[name]["median_s"] / 1e9
        result["compiled_mm_fraction"] = rows["neuron compiled"]["gflops"] / result["mm_gflops_median"]
        # The same, pair by pair (the step and the mm of one round saw the same load).
        result["compiled_mm_fraction_paired"] = statistics.median(
            (flops / s) / (mm_flops / m) for s, m in zip(times["neuron compiled"], mm_times))
        result["compiled_mm_fraction_best"] = (flops / rows["neuron compiled"]["min_s"] / 1e9) / result["mm_gflops_best"]

    print(f"  {'variant':<16} {'median':>10} {'IQR':>19} {'fastest':>10} {'first step':>11}  loss rel. diff"
          + ("   GFLOP/s" if mm_times else ""))
    for name in VARIANTS:
        row = rows[name]
        extra = f"   {row['gflops']:7.1f}" if mm_times else ""
        print(f"  {name:<16} {row['median_s'] * 1e3:8.1f}ms {row['q1_s'] * 1e3:8.1f}-{row['q3_s'] * 1e3:<8.1f}ms "
              f"{row['min_s'] * 1e3:8.1f}ms {row['first_step_s']:10.2f}s  {row['loss_rel_diff_vs_cpu_eager']:.1e}"
              + extra)
    print(f"  ratios (median over rounds): compiled/inductor {result['compiled_over_inductor']:.2f}, "
          f"neuron eager/compiled {result['eager_over_compiled']:.2f}, cpu eager/compiled "
          f"{result['cpu_eager_over_compiled']:.2f}, neuron eager/cpu eager {result['neuron_eager_over_cpu_eager']:.2f}")
    if mm_times:
        print(f"  torch.mm {MM_SIDE}^3 in the same rounds: median {result['mm_gflops_median']:.1f} GFLOP/s "
              f"(best {result['mm_gflops_best']:.1f}); compiled step {rows['neuron compiled']['gflops']:.1f} "
              f"GFLOP/s = {100 * result['compiled_mm_fraction']:.0f}% of it (paired "
              f"{100 * result['compiled_mm_fraction_paired']:.0f}%, best/best "
              f"{100 * result['compiled_mm_fraction_best']:.0f}%), counting 6 x {total / 1e6:.2f} M x "
              f"{size.tokens} = {flops / 1e9:.1f} GFLOP per step", flush=True)
    del trainers
    torch._dynamo.reset()
    return result


# --------------------------------------------------------------------------------------------
# Startup: cold compile vs. warm cache, in fresh processes
# --------------------------------------------------------------------------------------------


def child_startup(out_path: str) -> int:
    """Runs in a fresh process: times launch -> imports -> model -> first compiled step."""
    launch = float(os.environ["BENCH_COMPILE_LAUNCH"])
    marks = {"script_started": _T_MODULE - launch}
    import torch
    import transformers  # noqa: F401
    from transformers import LlamaForCausalLM  # noqa: F401

    import neuron_compile

    torch.empty(1, device=DEVICE)
    marks["imported"] = time.time() - launch
    size = SIZES["small"]
    base = _llama(size)
    tokens = torch.randint(0, size.vocab, (size.batch, size.seq), generator=torch.Generator().manual_seed(1))
    trainer = Trainer("neuron compiled", base, size, tokens)
    marks["model_ready"] = time.time() - launch
    loss = trainer.step().item()
    marks["first_step_done"] = time.time() - launch
    second = trainer.timed_step()
    counters = neuron_compile.metrics.counters()
    with open(out_path, "w") as f:
        json.dump({"marks": marks, "loss": loss, "second_step_s": second,
                   "counters": counters, "threads": torch.get_num_threads()}, f)
    return 0


def _run_child(neff_dir: str, inductor_dir: str, label: str) -> dict[str, Any]:
    env = dict(os.environ, TORCH_NEURONX_NEFF_CACHE_DIR=neff_dir, TORCHINDUCTOR_CACHE_DIR=inductor_dir)
    env.pop("TORCH_NEURONX_NEFF_DISABLE_CACHE", None)
    with tempfile.NamedTemporaryFile(suffix=".json", delete=False) as handle:
        out = handle.name
    env["BENCH_COMPILE_LAUNCH"] = repr(time.time())
    proc = subprocess.run([sys.executable, os.path.abspath(__file__), "--child-startup", out], env=env,
                          capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"startup child ({label}) failed:\n{proc.stderr[-4000:]}")
    with open(out) as f:
        result = json.load(f)
    os.unlink(out)
    m = result["marks"]
    c = result["counters"]
    print(f"  {label:<6} imports {m['imported']:6.1f} s  model {m['model_ready'] - m['imported']:5.1f} s  "
          f"first step {m['first_step_done'] - m['model_ready']:7.1f} s  -> launch to first step "
          f"{m['first_step_done']:7.1f} s  (graphs {c['graphs']}: compiled {c['compilations']}, "
          f"from disk {c['persistent_hits']}; loss {result['loss']:.6f})", flush=True)
    return result


def bench_startup(warm_runs: int, keep_root: str | None) -> dict[str, Any]:
    """Cold process, then warm ones: "warm" keeps both caches (a second run on the same machine);
    "neff-only" keeps only the NEFF cache, with an empty Inductor cache (the NEFF cache copied to
    another machine of the same CPU type: the executables alone must suffice)."""
    root = tempfile.mkdtemp(prefix="bench-compile-startup-", dir=keep_root)
    neff = os.path.join(root, "neff")
    inductor = os.path.join(root, "inductor")
    print(f"\n[startup] small model, fresh processes; caches under {root}", flush=True)
    try:
        cold = _run_child(neff, inductor, "cold")
        warm = [_run_child(neff, inductor, f"warm{i + 1}") for i in range(warm_runs)]
        neff_only = [_run_child(neff, os.path.join(root, f"inductor-empty{i}"), f"neff-only{i + 1}")
                     for i in range(warm_runs)]
    finally:
        if keep_root is None:
            shutil.rmtree(root, ignore_errors=True)
    cold_t = cold["marks"]["first_step_done"]
    warm_t = statistics.median(w["marks"]["first_step_done"] for w in warm)
    neff_only_t = statistics.median(w["marks"]["first_step_done"] for w in neff_only)
    imports = [r["marks"]["imported"] for r in [cold, *warm, *neff_only]]
    result = {"cold": cold, "warm": warm, "neff_only": neff_only, "cold_s": cold_t, "warm_s": warm_t,
              "neff_only_s": neff_only_t, "warm_fraction": warm_t / cold_t,
              "neff_only_fraction": neff_only_t / cold_t,
              "import_s_median": statistics.median(imports),
              "warm_fraction_after_imports": (warm_t - statistics.median(imports)) /
                                             (cold_t - cold["marks"]["imported"])}
    print(f"  warm / cold (launch to first step): {warm_t:.1f} / {cold_t:.1f} s = "
          f"{100 * result['warm_fraction']:.0f}%; excluding imports: {100 * result['warm_fraction_after_imports']:.0f}%; "
          f"NEFF cache only: {neff_only_t:.1f} s = {100 * result['neff_only_fraction']:.0f}%", flush=True)
    return result


# --------------------------------------------------------------------------------------------
# Buckets: graphs for 200 random lengths
# --------------------------------------------------------------------------------------------


def bench_buckets(nobucket_lengths: int) -> dict[str, Any]:
    import torch

    import neuron_compile
    from neuron_compile import BucketedCausalLM, MultipleOfBuckets

    lengths = random.Random(0).choices(range(1, 2049), k=200)
    policy = MultipleOfBuckets()
    model = _llama(TINY).to(DEVICE).eval()
    gen = torch.Generator().manual_seed(2)
    batches = [torch.randint(0, TINY.vocab, (1, n), generator=gen) for n in lengths]
    print(f"\n[buckets] {TINY.describe().split(', batch')[0]}; inference under torch.no_grad; "
          f"200 lengths drawn uniformly from 1..2048 (seed 0): {len(set(lengths))} distinct, "
          f"{len({policy.bucket_for(n) for n in lengths})} distinct buckets of {policy}", flush=True)

    def run(fn: Callable[..., Any], which: list[int]) -> dict[str, Any]:
        torch._dynamo.reset()
        before = neuron_compile.metrics.counters()
        t0 = time.perf_counter()
        with warnings.catch_warnings(record=True) as caught, torch.no_grad():
            warnings.simplefilter("always")
            for i in which:
                fn(input_ids=batches[i].to(DEVICE))
        after = neuron_compile.metrics.counters()
        churn = [str(w.message) for w in caught if type(w.message).__name__ == "ShapeChurnWarning"]
        return {"calls": len(which), "graphs": after["graphs"] - before["graphs"],
                "compilations": after["compilations"] - before["compilations"],
                "compile_s": after["compile_seconds_total"] - before["compile_seconds_total"],
                "wall_s": time.perf_counter() - t0, "shape_churn_warning": churn[0] if churn else None}

    bucketed = run(BucketedCausalLM(torch.compile(model, backend="neuron"), policy), list(range(200)))
    print(f"  with buckets ({policy}): 200 calls -> {bucketed['graphs']} graphs "
          f"({bucketed['compilations']} compiled, {bucketed['compile_s']:.0f} s compiling, "
          f"{bucketed['wall_s']:.0f} s in all)", flush=True)
    subset = list(range(nobucket_lengths))  # the first N draws: independent uniform lengths
    sub_distinct = len({lengths[i] for i in subset})
    plain = run(torch.compile(model, backend="neuron"), subset)
    per_graph = plain["compile_s"] / max(plain["compilations"], 1)
    distinct = len(set(lengths))
    print(f"  without buckets: the first {nobucket_lengths} lengths ({sub_distinct} distinct) -> "
          f"{plain['graphs']} graphs ({plain['compile_s']:.0f} s compiling, {per_graph:.1f} s per graph); "
          f"one graph per distinct length, so the 200 lengths -> {distinct} graphs "
          f"(~{distinct * per_graph / 60:.0f} min of compiling, extrapolated)", flush=True)
    if plain["shape_churn_warning"]:
        print(f"  ShapeChurnWarning: {plain['shape_churn_warning'][:240]}...")
    return {"lengths": lengths, "policy": str(policy), "bucketed": bucketed, "unbucketed_subset": plain,
            "subset_distinct": sub_distinct, "distinct_lengths": distinct,
            "unbucketed_graphs_extrapolated": distinct if plain["graphs"] == sub_distinct else None,
            "unbucketed_compile_s_extrapolated": distinct * per_graph}


# --------------------------------------------------------------------------------------------
# Reporting
# --------------------------------------------------------------------------------------------


def _bench_eager() -> Any:
    """bench/eager.py, for the machine description both benchmarks print (imported late: it loads torch)."""
    import eager

    return eager


def _verdict(ok: bool) -> str:
    return "PASS" if ok else "MISS"


def summary(results: dict[str, Any]) -> list[tuple[str, str, str, str]]:
    rows: list[tuple[str, str, str, str]] = []
    train = results.get("train", {})
    if "small" in train:
        s = train["small"]
        small = "small" if s.get("tokens", SIZES["small"].tokens) == SIZES["small"].tokens else f"small ({s['tokens']} tokens)"
        rows.append((f"{small}: compiled neuron / CPU Inductor step", f"{s['compiled_over_inductor']:.2f}x",
                     f"<= {GOALS['small_vs_inductor']:.2f}", _verdict(s["compiled_over_inductor"] <= GOALS["small_vs_inductor"])))
        rows.append((f"{small}: neuron eager / compiled neuron step", f"{s['eager_over_compiled']:.2f}x",
                     f">= {GOALS['small_vs_eager']:.2f}", _verdict(s["eager_over_compiled"] >= GOALS["small_vs_eager"])))
    if "large" in train:
        s = train["large"]
        rows.append(("large: compiled neuron / CPU Inductor step", f"{s['compiled_over_inductor']:.2f}x",
                     f"<= {GOALS['large_vs_inductor']:.2f}", _verdict(s["compiled_over_inductor"] <= GOALS["large_vs_inductor"])))
        if "compiled_mm_fraction" in s:
            rows.append(("large: compiled step FLOP/s / torch.mm FLOP/s",
                         f"{100 * s['compiled_mm_fraction']:.0f}% ({s['variants']['neuron compiled']['gflops']:.0f}"
                         f"/{s['mm_gflops_median']:.0f} GFLOP/s)",
                         f">= {100 * GOALS['large_mm_fraction']:.0f}%",
                         _verdict(s["compiled_mm_fraction"] >= GOALS["large_mm_fraction"])))
    if "startup" in results:
        s = results["startup"]
        rows.append(("warm-cache / cold start (launch to 1st step)",
                     f"{100 * s['warm_fraction']:.0f}% ({s['warm_s']:.0f}/{s['cold_s']:.0f} s)",
                     f"<= {100 * GOALS['warm_fraction']:.0f}%", _verdict(s["warm_fraction"] <= GOALS["warm_fraction"])))
    if "buckets" in results:
        b = results["buckets"]
        rows.append(("graphs, 200 lengths, default buckets", str(b["bucketed"]["graphs"]),
                     f"<= {GOALS['bucket_graphs']}", _verdict(b["bucketed"]["graphs"] <= GOALS["bucket_graphs"])))
        rows.append(("graphs, 200 lengths, no buckets",
                     f"{b['unbucketed_graphs_extrapolated']} (measured {b['unbucketed_subset']['graphs']} for "
                     f"{b['unbucketed_subset']['calls']})", "-", "-"))
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="fewer rounds, fewer unbucketed lengths")
    parser.add_argument("--json", metavar="PATH", help="write raw results (every step time) to PATH")
    parser.add_argument("--skip", default="", help="comma-separated parts to skip: mm,small,large,startup,buckets")
    parser.add_argument("--nobucket-lengths", type=int, help="lengths compiled without buckets (default 24; quick 8)")
    parser.add_argument("--cache-dir", help="keep compile caches here instead of fresh temporary directories")
    parser.add_argument("--threads", type=int, default=0,
                        help="torch.set_num_threads(N) in this process (default: torch's default)")
    parser.add_argument("--small-seq", type=int, default=SIZES["small"].seq,
                        help="tokens per step at the small size (default %(default)s; the startup part "
                             "always uses the default)")
    parser.add_argument("--child-startup", metavar="OUT", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child_startup:
        return child_startup(args.child_startup)
    s = QUICK if args.quick else FULL
    skip = set(filter(None, args.skip.split(",")))
    nobucket = args.nobucket_lengths if args.nobucket_lengths is not None else s.nobucket_lengths

    # This process's compile caches: fresh and empty (or --cache-dir), set before torch is imported.
    root = args.cache_dir or tempfile.mkdtemp(prefix="bench-compile-")
    os.makedirs(root, exist_ok=True)
    os.environ["TORCH_NEURONX_NEFF_CACHE_DIR"] = os.path.join(root, "neff")
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = os.path.join(root, "inductor")
    started = time.time()
    import torch
    import transformers

    if args.threads > 0:
        torch.set_num_threads(args.threads)
    meta = {
        "date": datetime.datetime.now().astimezone().isoformat(timespec="seconds"),
        "command": " ".join([os.path.relpath(sys.executable)] + sys.argv),
        "torch": torch.__version__, "transformers": transformers.__version__,
        "python": platform.python_version(), "nproc": os.cpu_count(), "cpu_model": _bench_eager()._cpu_model(),
        "threads": torch.get_num_threads(), "loadavg_start": os.getloadavg(),
        "settings": vars(s) | {"quick": args.quick, "nobucket_lengths": nobucket}, "cache_root": root,
    }
    print(f"{meta['command']}\n{meta['date']}  torch {meta['torch']}  transformers {meta['transformers']}  "
          f"{meta['nproc']} cpus ({meta['cpu_model']}), torch's default {meta['threads']} threads, "
          f"load {meta['loadavg_start'][0]:.2f}")
    if meta["loadavg_start"][0] > 0.5 * (os.cpu_count() or 1):
        print(f"WARNING: load average {meta['loadavg_start'][0]:.2f} on {os.cpu_count()} cpus: other work "
              f"is running; expect noisy times (the variants are interleaved so ratios suffer less).")
    print(f"compile caches of this process: {root} ({'kept' if args.cache_dir else 'fresh, removed at the end'})")
    warnings.filterwarnings("ignore", category=FutureWarning)
    warnings.filterwarnings("ignore", message=".*TF32.*")
    torch.empty(1, device=DEVICE)

    results: dict[str, Any] = {"meta": meta}
    try:
        if "mm" not in skip:
            print("\n[mm] fp32 matrix-multiply rate of this machine")
            results["mm"] = bench_mm()
        results["train"] = {}
        for name in ("small", "large"):
            if name not in skip:
                rounds = s.small_rounds if name == "small" else s.large_rounds
                size = replace(SIZES[name], seq=args.small_seq) if name == "small" else SIZES[name]
                results["train"][name] = bench_train(size, rounds, s.warmup_steps)
                results["train"][name]["tokens"] = size.tokens
        if "startup" not in skip:
            results["startup"] = bench_startup(s.startup_warm_runs, args.cache_dir)
        if "buckets" not in skip:
            results["buckets"] = bench_buckets(nobucket)
    finally:
        if not args.cache_dir:
            shutil.rmtree(root, ignore_errors=True)

    meta["loadavg_end"] = os.getloadavg()
    meta["elapsed_s"] = time.time() - started
    rows = summary(results)
    print("\nsummary")
    width = max((len(r[0]) for r in rows), default=10)
    vwidth = max((len(r[1]) for r in rows), default=10)
    for what, value, goal, verdict in rows:
        print(f"  {what:<{width}}  {value:>{vwidth}}  {goal:>8}  {verdict}")
    if "startup" in results:
        st = results["startup"]
        print(f"  (fixed cost in every process: imports {st['import_s_median']:.1f} s of the launch-to-first-step "
              f"time; excluding them warm/cold = {100 * st['warm_fraction_after_imports']:.0f}%)")
    verdicts = [r[3] for r in rows if r[3] != "-"]
    print(f"  {verdicts.count('PASS')}/{len(verdicts)} goals PASS; {meta['elapsed_s'] / 60:.1f} min; "
          f"load {meta['loadavg_start'][0]:.2f} -> {meta['loadavg_end'][0]:.2f}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)
        print(f"  raw results: {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
