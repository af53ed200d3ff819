#!/usr/bin/env python
"""Eager-mode cost of the emulated ``neuron`` device relative to the CPU, in one run.

The neuron device runs every op through the CPU kernel, so the CPU is the exact baseline:
``ratio = neuron time / CPU time`` is the price of the device layer (dispatch through the
boxed fallback, CPU views of device memory, the caching allocator).

Three parts:

* **ops**: a dozen common ops at a small size (1024 elements: fixed per-op overhead
  dominates) and a large size (~1M elements: bandwidth and compute dominate).
* **train**: one training step (forward, backward, AdamW) of a small transformer model
  (hidden 256, seq 128, batch 8), built from the same seed on both devices; the losses of
  the first steps must agree to fp32 tolerance.
* **probes** (no goal): absolute extra nanoseconds per call for ops chosen to separate the
  costs of the device layer (see bench/README.md).

Measurement, built for a small, shared, noisy machine: warm-up; runs of calls calibrated
to a fixed duration; a block is the fastest of a few runs (drops runs hit by preemption);
CPU and neuron blocks interleaved, the order alternating (ABBA); the ratio of each adjacent
(CPU, neuron) pair of blocks; the median over pairs. Garbage collection is off while timing
and the number of threads is torch's default.

    .venv/bin/python bench/eager.py            # full run (~2 minutes)
    .venv/bin/python bench/eager.py --quick    # fewer, shorter blocks (~30 s)
    .venv/bin/python bench/eager.py --json out.json
"""

from __future__ import annotations

import argparse
import copy
import datetime
import gc
import hashlib
import json
import os
import platform
import statistics
import sys
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

DEVICE = "neuron"
GOALS = {"small": 1.30, "large": 1.05, "train": 1.15}
SMALL = 1024  # elements
LARGE_SIDE = 1024  # large tensors are 1024 x 1024 = 1M elements
STALL_NS = 300_000  # a 1024-element op this slow waited for a preempted OpenMP thread


# --------------------------------------------------------------------------------------------
# Timing
# --------------------------------------------------------------------------------------------


@dataclass
class Settings:
    blocks: int  # interleaved (CPU, neuron) block pairs per row
    block_ms: float  # target duration of one block
    subs: int  # runs per block; a block's time is its fastest run
    warmup_ms: float
    train_blocks: int
    train_steps_per_block: int
    probe_blocks: int


FULL = Settings(blocks=21, block_ms=30.0, subs=10, warmup_ms=40.0, train_blocks=11,
                train_steps_per_block=3, probe_blocks=21)
QUICK = Settings(blocks=7, block_ms=12.0, subs=4, warmup_ms=15.0, train_blocks=5,
                 train_steps_per_block=1, probe_blocks=7)


def _sync() -> None:
    sync = getattr(getattr(torch, DEVICE, None), "synchronize", None)
    if sync is not None:
        sync()


def _run(fn: Callable[[], Any], n: int) -> float:
    """Nanoseconds per call of n back-to-back calls."""
    perf = time.perf_counter_ns
    t0 = perf()
    for _ in range(n):
        fn()
    _sync()
    return (perf() - t0) / n


def _warm_and_estimate(fn: Callable[[], Any], warmup_ms: float) -> float:
    """Runs fn for about warmup_ms; returns an estimate of ns per call."""
    fn()
    _sync()
    n, spent, per_call = 1, 0.0, 0.0
    while spent < warmup_ms * 1e6:
        per_call = _run(fn, n)
        spent += per_call * n
        n = min(n * 2, 1 << 16)
    return per_call


@dataclass
class Measurement:
    cpu_ns: list[float] = field(default_factory=list)
    dev_ns: list[float] = field(default_factory=list)
    reps: int = 0  # calls per run
    subs: int = 1  # runs per block (the fastest counts)

    @property
    def pair_ratios(self) -> list[float]:
        return [d / c for c, d in zip(self.cpu_ns, self.dev_ns)]

    @property
    def ratio(self) -> float:
        return statistics.median(self.pair_ratios)

    @property
    def cpu_median(self) -> float:
        return statistics.median(self.cpu_ns)

    @property
    def dev_median(self) -> float:
        return statistics.median(self.dev_ns)

    @property
    def spread(self) -> tuple[float, float]:
        """Interquartile range of the pair ratios (how noisy the row was)."""
        q = statistics.quantiles(self.pair_ratios, n=4) if len(self.cpu_ns) > 1 else [self.ratio] * 3
        return q[0], q[2]

    @property
    def best_ratio(self) -> float:
        """Fastest neuron block over fastest CPU block (a second, load-insensitive view)."""
        return min(self.dev_ns) / min(self.cpu_ns)

    def as_dict(self) -> dict[str, Any]:
        lo, hi = self.spread
        return {"ratio": self.ratio, "ratio_q1": lo, "ratio_q3": hi, "best_ratio": self.best_ratio,
                "cpu_ns": self.cpu_median,
                "neuron_ns": self.dev_median, "calls_per_run": self.reps, "runs_per_block": self.subs,
                "cpu_blocks_ns": self.cpu_ns, "neuron_blocks_ns": self.dev_ns}


def _block(fn: Callable[[], Any], reps: int, subs: int) -> float:
    """One block: `subs` runs of `reps` calls; the fastest run's ns per call.

    Taking the fastest of a few short runs drops the runs in which the process was
    descheduled, which on a loaded 2-core machine is most of the noise.
    """
    return min(_run(fn, reps) for _ in range(subs))


def measure(cpu_fn: Callable[[], Any], dev_fn: Callable[[], Any], blocks: int, block_ms: float,
            warmup_ms: float, subs: int, reps: int | None = None) -> Measurement:
    """Interleaved blocks of cpu_fn and dev_fn, the order alternating (ABBA...)."""
    est_cpu = _warm_and_estimate(cpu_fn, warmup_ms)
    est_dev = _warm_and_estimate(dev_fn, warmup_ms)
    if reps is None:
        per_call = max(est_cpu, est_dev, 1.0)
        reps = max(1, int(block_ms * 1e6 / subs / per_call))
        if reps == 1:  # long calls: fewer runs per block, so a block stays near block_ms
            subs = max(1, min(subs, round(block_ms * 1e6 / per_call)))
    m = Measurement(reps=reps, subs=subs)
    gc_was_enabled = gc.isenabled()
    gc.disable()
    try:
        for b in range(blocks):
            if b % 2 == 0:
                c = _block(cpu_fn, reps, subs)
                d = _block(dev_fn, reps, subs)
            else:
                d = _block(dev_fn, reps, subs)
                c = _block(cpu_fn, reps, subs)
            m.cpu_ns.append(c)
            m.dev_ns.append(d)
    finally:
        if gc_was_enabled:
            gc.enable()
    return m


# --------------------------------------------------------------------------------------------
# Ops
# --------------------------------------------------------------------------------------------


def _on(device: str, tensors: dict[str, Any]) -> dict[str, Any]:
    return {k: (v.to(device) if isinstance(v, torch.Tensor) else v) for k, v in tensors.items()}


def _inputs(op: str, size: str, gen: torch.Generator) -> dict[str, Any]:
    """CPU inputs for one op; `small` has 1024 elements, `large` ~1M."""
    side = 32 if size == "small" else LARGE_SIDE
    shape = (side, side)

    def r(*s: int) -> torch.Tensor:
        return torch.randn(*s, generator=gen)

    if op == "embedding":
        rows, dim = (64, 16) if size == "small" else (8192, 128)  # weight and output: 1K / 1M
        return {"w": r(rows, dim), "idx": torch.randint(0, rows, (rows,), generator=gen)}
    if op == "layer_norm":
        return {"x": r(*shape), "w": r(side), "b": r(side)}
    if op == "where":
        return {"c": r(*shape) > 0, "x": r(*shape), "y": r(*shape)}
    if op == "copy_":
        return {"dst": torch.empty(shape), "x": r(*shape)}
    return {"x": r(*shape), "y": r(*shape)}


OPS: dict[str, Callable[[dict[str, Any]], Any]] = {
    "add": lambda t: t["x"] + t["y"],
    "mul": lambda t: t["x"] * t["y"],
    "mm": lambda t: torch.mm(t["x"], t["y"]),
    "softmax": lambda t: torch.softmax(t["x"], dim=-1),
    "layer_norm": lambda t: F.layer_norm(t["x"], t["w"].shape, t["w"], t["b"]),
    "gelu": lambda t: F.gelu(t["x"]),
    "relu": lambda t: torch.relu(t["x"]),
    "exp": lambda t: torch.exp(t["x"]),
    "sum": lambda t: t["x"].sum(),
    "cat": lambda t: torch.cat([t["x"], t["y"]]),
    "embedding": lambda t: F.embedding(t["idx"], t["w"]),
    "transpose_contig": lambda t: t["x"].t().contiguous(),
    "clone": lambda t: t["x"].clone(),
    "copy_": lambda t: t["dst"].copy_(t["x"]),
    "where": lambda t: torch.where(t["c"], t["x"], t["y"]),
}


def _same(a: Any, b: Any) -> bool:
    try:
        torch.testing.assert_close(b.cpu() if isinstance(b, torch.Tensor) else b, a)
        return True
    except AssertionError:
        return False


def bench_ops(s: Settings, only: set[str] | None) -> list[dict[str, Any]]:
    rows = []
    gen = torch.Generator().manual_seed(0)
    for size in ("small", "large"):
        for name, op in OPS.items():
            if only and name not in only:
                continue
            cpu_t = _inputs(name, size, gen)
            dev_t = _on(DEVICE, cpu_t)
            ok = _same(op(cpu_t), op(dev_t))
            m = measure(lambda: op(cpu_t), lambda: op(dev_t), s.blocks, s.block_ms, s.warmup_ms, s.subs)
            row = {"kind": size, "name": name, "goal": GOALS[size], "correct": ok, **m.as_dict()}
            rows.append(row)
            _print_row(row)
            del cpu_t, dev_t
    return rows


# --------------------------------------------------------------------------------------------
# Training step
# --------------------------------------------------------------------------------------------

HIDDEN, SEQ, BATCH, VOCAB, HEADS = 256, 128, 8, 1024, 4


def _make_model() -> nn.Module:
    layer = nn.TransformerEncoderLayer(HIDDEN, nhead=HEADS, dim_feedforward=4 * HIDDEN,
                                       dropout=0.0, batch_first=True, norm_first=True)
    return nn.Sequential(nn.Embedding(VOCAB, HIDDEN), layer, nn.LayerNorm(HIDDEN),
                         nn.Linear(HIDDEN, VOCAB))


class Trainer:
    def __init__(self, model: nn.Module, tokens: torch.Tensor, device: str, foreach: bool | None):
        self.model = model.to(device)
        self.opt = torch.optim.AdamW(self.model.parameters(), lr=1e-3, foreach=foreach)
        self.inp = tokens[:, :-1].contiguous().to(device)
        self.tgt = tokens[:, 1:].reshape(-1).to(device)

    def step(self) -> torch.Tensor:
        self.opt.zero_grad(set_to_none=True)
        logits = self.model(self.inp)
        loss = F.cross_entropy(logits.reshape(-1, VOCAB), self.tgt)
        loss.backward()
        self.opt.step()
        return loss.detach()

    def implementation(self) -> str:
        from torch.optim.optimizer import _default_to_fused_or_foreach

        foreach = self.opt.defaults["foreach"]
        if foreach is None:
            _, foreach = _default_to_fused_or_foreach(list(self.model.parameters()), False, False)
        return "foreach" if foreach else "for-loop"


def bench_train(s: Settings, foreach: bool | None, check_steps: int = 3) -> dict[str, Any]:
    torch.manual_seed(0)
    base = _make_model()
    tokens = torch.randint(0, VOCAB, (BATCH, SEQ + 1), generator=torch.Generator().manual_seed(1))

    # Correctness: identical initial weights and data, a few steps on each device.
    cpu = Trainer(copy.deepcopy(base), tokens, "cpu", foreach)
    dev = Trainer(copy.deepcopy(base), tokens, DEVICE, foreach)
    cpu_losses = [cpu.step().item() for _ in range(check_steps)]
    dev_losses = [dev.step().item() for _ in range(check_steps)]
    max_rel = max(abs(a - b) / max(abs(a), 1e-12) for a, b in zip(cpu_losses, dev_losses))
    losses_match = max_rel <= 1e-4

    # A block is the fastest of train_steps_per_block single steps.
    m = measure(cpu.step, dev.step, s.train_blocks, 0.0, 0.0, subs=s.train_steps_per_block, reps=1)
    row = {"kind": "train", "name": f"transformer step (AdamW {cpu.implementation()} / "
                                    f"{dev.implementation()})",
           "goal": GOALS["train"], "correct": losses_match, "cpu_losses": cpu_losses,
           "neuron_losses": dev_losses, "loss_max_rel_diff": max_rel, **m.as_dict()}
    _print_row(row)
    print(f"  losses over {check_steps} steps  cpu: {[f'{x:.6f}' for x in cpu_losses]}")
    print(f"                        neuron: {[f'{x:.6f}' for x in dev_losses]}")
    print(f"  max relative difference {max_rel:.2e} -> "
          f"{'MATCH' if losses_match else 'MISMATCH'} (tolerance 1e-4)")
    return row


# --------------------------------------------------------------------------------------------
# Probes: where the extra time per op goes
# --------------------------------------------------------------------------------------------


def _probe_cases() -> dict[str, Callable[[dict[str, Any]], Any]]:
    # "extra" is neuron minus CPU per call. view: a neuron kernel, no fallback (dispatcher and
    # Python cost of a neuron tensor); empty: the caching allocator; relu: the fallback with
    # one CPU view and one output; add out=: three views, no allocation; add / add_: a
    # structured op's functional and in-place forms (cost more than out= when the op is not
    # routed straight to the fallback); cat 8: a tensor list; copy_: _copy_from.
    return {
        "view (no fallback)": lambda t: t["x"].view(-1),
        "empty(1024) (allocator)": lambda t: torch.empty(SMALL, device=t["dev"]),
        "relu (fallback: 1 view + 1 alloc)": lambda t: torch.relu(t["x"]),
        "add out= (fallback: 3 views)": lambda t: torch.add(t["x"], t["y"], out=t["o"]),
        "add (structured functional)": lambda t: t["x"] + t["y"],
        "add_ (structured in-place)": lambda t: t["o"].add_(t["y"]),
        "cat of 8 (tensor list: 8 views)": lambda t: torch.cat(t["l8"]),
        "copy_ (_copy_from: 2 views)": lambda t: t["o"].copy_(t["x"]),
    }


def bench_probes(s: Settings) -> list[dict[str, Any]]:
    gen = torch.Generator().manual_seed(2)
    base = {"x": torch.randn(SMALL, generator=gen), "y": torch.randn(SMALL, generator=gen),
            "o": torch.zeros(SMALL)}
    base["l8"] = [torch.randn(SMALL // 8, generator=gen) for _ in range(8)]
    rows = []
    for name, fn in _probe_cases().items():
        cpu_t = dict(base, dev="cpu")
        dev_t = _on(DEVICE, base)
        dev_t["l8"] = [t.to(DEVICE) for t in base["l8"]]
        dev_t["dev"] = DEVICE
        m = measure(lambda: fn(cpu_t), lambda: fn(dev_t), s.probe_blocks, s.block_ms, s.warmup_ms,
                    s.subs)
        extra = statistics.median(d - c for c, d in zip(m.cpu_ns, m.dev_ns))
        row = {"kind": "probe", "name": name, "extra_ns": extra, **m.as_dict()}
        rows.append(row)
        print(f"  {name:<36} cpu {m.cpu_median:8.0f} ns  neuron {m.dev_median:8.0f} ns  "
              f"extra {extra:+7.0f} ns  ({m.ratio:.2f}x)")
    return rows


# --------------------------------------------------------------------------------------------
# Reporting
# --------------------------------------------------------------------------------------------


def _fmt_ns(ns: float) -> str:
    if ns >= 1e6:
        return f"{ns / 1e6:8.2f} ms"
    if ns >= 1e3:
        return f"{ns / 1e3:8.2f} us"
    return f"{ns:8.0f} ns"


HEADER = (f"{'kind':<6} {'name':<18} {'cpu':>11} {'neuron':>11} {'ratio':>6} "
          f"{'IQR':>11} {'best':>5} {'goal':>6}  verdict")


def _print_row(row: dict[str, Any]) -> None:
    verdict = "PASS" if row["ratio"] <= row["goal"] else "MISS"
    note = "" if row.get("correct", True) else "  (WRONG RESULT)"
    if row["kind"] == "small" and min(row["cpu_ns"], row["neuron_ns"]) > STALL_NS:
        note += "  (stalled: a worker thread was preempted; see README)"
    name = row["name"] if row["kind"] != "train" else "train step"
    print(f"{row['kind']:<6} {name:<18} {_fmt_ns(row['cpu_ns'])} {_fmt_ns(row['neuron_ns'])} "
          f"{row['ratio']:6.2f} {row['ratio_q1']:5.2f}-{row['ratio_q3']:<5.2f} {row['best_ratio']:5.2f} "
          f"{'<=' + format(row['goal'], '.2f'):>6}  {verdict}{note}", flush=True)


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def _runtime_build() -> dict[str, Any]:
    try:
        import neuron_runtime

        path = neuron_runtime._C.__file__
        with open(path, "rb") as f:
            digest = hashlib.sha256(f.read()).hexdigest()[:12]
        mtime = datetime.datetime.fromtimestamp(os.path.getmtime(path)).isoformat(timespec="seconds")
        return {"path": path, "sha256_12": digest, "mtime": mtime}
    except Exception as error:  # noqa: BLE001 (informational only)
        return {"error": repr(error)}


def _counters() -> tuple[dict[str, int], dict[str, int]]:
    """(copy fallbacks, float64 ops) counted by the runtime so far."""
    try:
        import neuron_runtime

        return neuron_runtime.get_fallback_ops(), neuron_runtime.get_float64_ops()
    except Exception:  # noqa: BLE001
        return {}, {}


def _delta(after: dict[str, int], before: dict[str, int]) -> dict[str, int]:
    return {k: v - before.get(k, 0) for k, v in after.items() if v != before.get(k, 0)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="fewer and shorter blocks (~30 s)")
    parser.add_argument("--json", metavar="PATH", help="write raw results (every block) to PATH")
    parser.add_argument("--ops", help="comma-separated subset of ops (default: all)")
    parser.add_argument("--skip", default="", help="comma-separated parts to skip: ops,train,probes")
    parser.add_argument("--threads", type=int, default=0,
                        help="torch.set_num_threads(N) for diagnosis (default: torch's default)")
    parser.add_argument("--foreach", choices=("auto", "on", "off"), default="auto",
                        help="AdamW implementation on both devices (default: torch's default)")
    args = parser.parse_args(argv)
    s = QUICK if args.quick else FULL
    skip = set(filter(None, args.skip.split(",")))
    only = set(args.ops.split(",")) if args.ops else None
    foreach = {"auto": None, "on": True, "off": False}[args.foreach]

    if args.threads > 0:
        torch.set_num_threads(args.threads)
    started = time.time()
    meta = {
        "date": datetime.datetime.now().astimezone().isoformat(timespec="seconds"),
        "command": " ".join([os.path.relpath(sys.executable)] + sys.argv),
        "torch": torch.__version__, "python": platform.python_version(),
        "nproc": os.cpu_count(), "cpu_model": _cpu_model(), "threads": torch.get_num_threads(),
        "loadavg_start": os.getloadavg(), "runtime_build": _runtime_build(),
        "settings": vars(s) | {"quick": args.quick, "foreach": args.foreach},
    }
    print(f"{meta['command']}\n{meta['date']}  torch {meta['torch']}  {meta['nproc']} cpus "
          f"({meta['cpu_model']}), {meta['threads']} threads, load {meta['loadavg_start'][0]:.2f}")
    build = meta["runtime_build"]
    print(f"neuron runtime: {build.get('path', '?')} sha256 {build.get('sha256_12', '?')} "
          f"built {build.get('mtime', '?')}")
    print(f"ratio = neuron time / CPU time, median over {s.blocks} interleaved block pairs "
          f"(a block: the fastest of {s.subs} runs of ~{s.block_ms / s.subs:.0f} ms); "
          f"IQR = quartiles of the pair ratios;\nbest = fastest neuron block / fastest CPU block. "
          f"cpu/neuron columns: median time per call.\n")
    if meta["loadavg_start"][0] > 0.5 * (os.cpu_count() or 1):
        print(f"WARNING: load average {meta['loadavg_start'][0]:.2f} on {os.cpu_count()} cpus: "
              f"other work is running; expect noisy ratios.\n")
    torch.empty(1, device=DEVICE)  # initialise the device outside any measurement
    copies_before, float64_before = _counters()

    warnings.filterwarnings("ignore", message="neuron: .* uses Double")  # counted below
    rows: list[dict[str, Any]] = []
    if "ops" not in skip:
        print(HEADER)
        rows += bench_ops(s, only)
    if "train" not in skip:
        print(f"\ntraining step: TransformerEncoderLayer(d={HIDDEN}, heads={HEADS}, ff={4 * HIDDEN}) + "
              f"embedding/head (vocab {VOCAB}), batch {BATCH}, seq {SEQ}, AdamW; "
              f"{s.train_blocks} block pairs, a block the fastest of {s.train_steps_per_block} step(s)")
        print(HEADER)
        rows.append(bench_train(s, foreach))
    probes: list[dict[str, Any]] = []
    if "probes" not in skip:
        print("\nprobes (1024 elements; no goal): where the extra time per op goes")
        probes = bench_probes(s)

    copies_after, float64_after = _counters()
    copies, float64 = _delta(copies_after, copies_before), _delta(float64_after, float64_before)
    scored = rows
    missed = [r for r in scored if r["ratio"] > r["goal"]]
    wrong = [r for r in scored if not r.get("correct", True)]
    print("\nsummary")
    for kind in ("small", "large", "train"):
        group = [r for r in scored if r["kind"] == kind]
        if not group:
            continue
        ratios = [r["ratio"] for r in group]
        geo = statistics.geometric_mean(ratios)
        misses = [r["name"] for r in group if r["ratio"] > r["goal"]]
        print(f"  {kind:<6} goal <= {GOALS[kind]:.2f}x: {len(group) - len(misses)}/{len(group)} PASS, "
              f"geomean {geo:.2f}x, worst {max(ratios):.2f}x"
              + (f"; MISS: {', '.join(misses)}" if misses else ""))
    if wrong:
        print(f"  WRONG RESULTS: {', '.join(r['name'] for r in wrong)}")
    print(f"  copy fallbacks during the run: {copies or 'none'}")
    print(f"  float64 ops counted by the runtime: {float64 or 'none'}")
    elapsed = time.time() - started
    meta["loadavg_end"] = os.getloadavg()
    meta["elapsed_s"] = elapsed
    print(f"  {len(scored) - len(missed)}/{len(scored)} rows PASS; {elapsed:.0f} s; "
          f"load {meta['loadavg_start'][0]:.2f} -> {meta['loadavg_end'][0]:.2f}")

    if args.json:
        with open(args.json, "w") as f:
            json.dump({"meta": meta, "rows": rows, "probes": probes, "copy_fallbacks": copies,
                       "float64_ops": float64}, f,
                      indent=1)
        print(f"  raw results: {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
