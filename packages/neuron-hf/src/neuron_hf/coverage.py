"""Architecture coverage: every causal-LM architecture transformers registers, on neuron vs the CPU.

For each model type in ``MODEL_FOR_CAUSAL_LM_MAPPING_NAMES`` a tiny random instance is built
from its default config with the size fields shrunk (hidden 64, 2 layers, 4 heads, 2 KV heads,
vocab 256, small MoE/MLA/SSM dims). The same weights then run, on the CPU and on neuron:

* forward on a fixed batch, and backward of a cross-entropy loss on its logits;
* greedy ``generate`` with the static cache (the dynamic cache where the CPU itself cannot use
  a static one) for a few tokens.

A column passes when logits and gradients agree within fp32 tolerance and the generated
tokens are equal. ``--compiled`` adds a column for ``torch.compile(backend="neuron")``
(forward/backward through the compiled module, generate through transformers' own
auto-compilation with the neuron backend). Architectures run in worker processes that are
replaced after a crash or a per-architecture timeout, so one failure never stops the table.

    python -m neuron_hf.coverage                       # all, writes docs/architecture_coverage.md
    python -m neuron_hf.coverage llama gpt2 --output -  # a subset, table on stdout
    python -m neuron_hf.coverage --compiled --resume cov.jsonl   # stop and rerun: goes on where it was
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import inspect
import json
import os
import queue
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from collections.abc import Iterable, Sequence
from typing import Any

__all__ = [
    "ArchResult", "all_architectures", "main", "render_markdown", "run_architecture", "run_coverage", "tiny_config",
]

_MARK = "@@neuron-hf-coverage@@ "
_STARTUP_TIMEOUT = 600.0  # seconds for a worker's imports on a loaded machine
_SEQ = 8
_BATCH = 2
_NEW_TOKENS = 4
_RTOL = 1e-4  # error allowed relative to the largest magnitude of the CPU tensor ...
_ATOL = 1e-5  # ... plus this absolute floor (fp32 accumulation-order noise)

# Size fields and their aliases across configs, shrunk only where the default config has them.
_SIZES: dict[str, int] = {
    "vocab_size": 256, "vocab_size_per_layer_input": 256, "hidden_size_per_layer_input": 16,
    "hidden_size": 64, "n_embd": 64, "d_model": 64, "n_embed": 64, "dim": 64, "embed_dim": 64, "emb_dim": 64,
    "num_hidden_layers": 2, "n_layer": 2, "num_layers": 2, "n_layers": 2, "decoder_layers": 2, "encoder_layers": 2,
    "num_attention_heads": 4, "n_head": 4, "num_heads": 4, "n_heads": 4, "decoder_attention_heads": 4,
    "encoder_attention_heads": 4,
    "num_key_value_heads": 2, "n_head_kv": 2, "num_kv_heads": 2, "n_kv_heads": 2, "multi_query_group_num": 2,
    "intermediate_size": 128, "n_inner": 128, "ffn_dim": 128, "d_ff": 128, "ffn_hidden_size": 128,
    "decoder_ffn_dim": 128, "encoder_ffn_dim": 128, "inner_hidden_size": 128, "dim_feedforward": 128,
    "head_dim": 16, "attention_head_dim": 16, "d_kv": 16, "rotary_dim": 8,
    "max_position_embeddings": 512, "n_positions": 512, "n_ctx": 512, "max_target_positions": 512,
    "max_source_positions": 512,
    # mixture of experts
    "num_experts": 4, "num_local_experts": 4, "n_routed_experts": 4, "moe_num_experts": 4,
    "num_experts_per_tok": 2, "moe_topk": 2, "moe_k": 2, "num_experts_per_token": 2,
    "moe_intermediate_size": 32, "shared_expert_intermediate_size": 32, "expert_intermediate_size": 32,
    "moe_ffn_hidden_size": 32, "n_shared_experts": 1, "num_shared_experts": 1, "moe_num_shared_experts": 1,
    "n_group": 1, "topk_group": 1, "first_k_dense_replace": 1,
    # multi-head latent attention
    "q_lora_rank": 32, "kv_lora_rank": 16, "qk_rope_head_dim": 8, "qk_nope_head_dim": 8, "v_head_dim": 16,
    # state-space / linear-attention blocks
    "state_size": 16, "ssm_state_size": 16, "mamba_d_state": 16, "d_state": 16,
    "linear_num_key_heads": 2, "linear_num_value_heads": 4, "linear_key_head_dim": 16, "linear_value_head_dim": 16,
}

# Set even where the default config leaves them unset (some models never compute them).
_SET_EVEN_IF_NONE = ("head_dim", "num_key_value_heads", "num_experts_per_tok")

# Where a default does not fit the shrunk sizes; keyed by model type, applied last. Mostly
# hybrid layer patterns whose first two layers would otherwise have no attention layer.
_ARCH_OVERRIDES: dict[str, dict[str, Any]] = {
    "bamba": {"attn_layer_indices": [1]},
    "granitemoehybrid": {"layer_types": ["linear_attention", "full_attention"]},
    "jamba": {"attn_layer_period": 2, "attn_layer_offset": 1, "expert_layer_period": 2, "expert_layer_offset": 1},
    "recurrent_gemma": {"block_types": ["recurrent", "attention"]},
    "mamba2": {"num_heads": 8, "n_groups": 1},  # hidden 64 x expand 2 = 8 heads x 16
    "gpt_neo": {"attention_types": [[["global", "local"], 1]]},
    "reformer": {"is_decoder": True, "attn_layers": ["local", "lsh"], "axial_pos_shape": [16, 32],
                 "axial_pos_embds_dim": [32, 32]},
    "lfm2_moe": {"layer_types": ["conv", "full_attention"]},
    "dots1": {"n_routed_experts": 4, "num_experts_per_tok": 2},
    "zaya": {"num_experts_per_tok": 1},  # the model supports only top-1 routing
}


# -- tiny configs ---------------------------------------------------------------------------------


def _field_defaults(config_class: type) -> dict[str, Any]:
    """Constructor fields of a config class and their class-level defaults (``None`` if computed)."""
    if dataclasses.is_dataclass(config_class):
        out = {}
        for f in dataclasses.fields(config_class):
            if f.default is not dataclasses.MISSING:
                out[f.name] = f.default
            elif f.default_factory is not dataclasses.MISSING:  # type: ignore[misc]
                out[f.name] = f.default_factory()  # type: ignore[misc]
            else:
                out[f.name] = None
        return out
    params = inspect.signature(config_class.__init__).parameters
    return {n: (None if p.default is inspect.Parameter.empty else p.default) for n, p in params.items() if n != "self"}


def _get(config: Any, name: str) -> Any:
    """``getattr`` that treats properties refusing to answer (per-layer attributes) as unset."""
    try:
        return getattr(config, name, None)
    except Exception:  # noqa: BLE001
        return None


def _shrunk_kwargs(config_class: type) -> dict[str, Any]:
    """Constructor overrides that make ``config_class()`` tiny (recursing into sub-configs)."""
    default = config_class()
    fields = _field_defaults(config_class)
    attribute_map = getattr(config_class, "attribute_map", {}) or {}
    out: dict[str, Any] = {}
    # Real field names first, then aliases (attribute_map) for fields still unset: an alias can
    # point at a different quantity (GLM's "head_dim" is its rope head dim).
    for aliases in (False, True):
        for name, value in _SIZES.items():
            target = attribute_map.get(name) if aliases else name
            if target is None or target not in fields or target in out:
                continue
            current = _get(default, target)
            if name in _SET_EVEN_IF_NONE and current is None and not aliases:
                out[target] = value
            elif isinstance(current, int) and not isinstance(current, bool):
                out[target] = min(value, current) if name == "first_k_dense_replace" else value
    layers = next((_get(default, k) for k in ("num_hidden_layers", "n_layer", "num_layers", "n_layers")
                   if isinstance(_get(default, k), int)), None)
    for name in fields:
        value = _get(default, name)
        # Per-layer lists (given or computed from the layer count): keep the first entry and the
        # first entry of another kind, so both kinds of layer of a hybrid pattern survive.
        if isinstance(value, list | tuple) and layers and len(value) == layers and layers > 2 and name not in out:
            other = next((v for v in value if v != value[0]), value[-1])
            out[name] = [value[0], other]
        if name.endswith("token_id") and value is not None:
            out[name] = _small_token_ids(value)
    if "kv_lora_rank" in out and "num_key_value_heads" in out:  # latent attention: one KV head per head
        out["num_key_value_heads"] = _SIZES["num_attention_heads"]
    for key, declared in (getattr(config_class, "sub_configs", None) or {}).items():
        if key not in fields:
            continue
        # The declared class can be AutoConfig: the default instance knows the concrete one.
        sub_default = _get(default, key)
        sub_class = type(sub_default) if hasattr(sub_default, "model_type") else declared
        try:
            sub = _shrunk_kwargs(sub_class)
        except Exception as err:  # a full-size sub-model would only be slow: fail fast instead
            raise ValueError(f"cannot shrink {key} ({sub_class.__name__}): {_short_error(err)}") from err
        if sub and sub_class is not declared:
            sub["model_type"] = sub_default.model_type
        if sub:
            out[key] = sub
    return out


def _small_token_ids(value: Any) -> Any:
    if isinstance(value, list):
        return [_small_token_ids(v) for v in value]
    if isinstance(value, int) and value >= 250:
        return 250 + value % 6
    return value


def tiny_config(model_type: str) -> Any:
    """The default config of ``model_type`` with its size fields shrunk."""
    from transformers import CONFIG_MAPPING

    config_class = CONFIG_MAPPING[model_type]
    kwargs = _shrunk_kwargs(config_class)
    kwargs.update(_ARCH_OVERRIDES.get(model_type, {}))
    return config_class(**kwargs)


def all_architectures() -> list[str]:
    """Every model type transformers maps to a causal-LM class."""
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    return sorted(MODEL_FOR_CAUSAL_LM_MAPPING_NAMES)


# -- one architecture ------------------------------------------------------------------------------


@dataclasses.dataclass
class ArchResult:
    """Outcome of one architecture: per column ``ok``, ``mismatch``, ``fail`` or ``skip``; the compiled
    column also ``as-inductor`` (differs from CPU eager exactly as CPU Inductor does)."""

    arch: str
    model_class: str = ""
    cpu: str = "fail"
    neuron: str = "skip"
    compiled: str = "skip"
    detail: str = ""
    neuron_detail: str = ""
    compiled_detail: str = ""
    cache: str = "static"
    params: int = 0
    seconds: float = 0.0


def _short_error(err: BaseException) -> str:
    text = f"{type(err).__name__}: {err}".strip().splitlines()[0]
    return text[:300]


def _build(arch: str) -> Any:
    import torch
    from transformers import AutoModelForCausalLM

    config = tiny_config(arch)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    return model.eval()


def _inputs(vocab: int) -> Any:
    import torch

    high = max(4, min(vocab, 250))
    return torch.randint(3, high, (_BATCH, _SEQ), generator=torch.Generator().manual_seed(1))


def _forward_backward(model: Any, ids: Any, call: Any = None) -> tuple[Any, dict[str, Any]]:
    import torch

    model.zero_grad(set_to_none=True)
    try:
        out = (call if call is not None else model)(input_ids=ids, use_cache=False)
    except TypeError:  # models without a cache argument
        out = (call if call is not None else model)(input_ids=ids)
    logits = out.logits if hasattr(out, "logits") else out[0]
    logits = logits.float()
    loss = torch.nn.functional.cross_entropy(
        logits[:, :-1].reshape(-1, logits.shape[-1]), ids[:, 1:].reshape(-1) % logits.shape[-1]
    )
    loss.backward()
    grads = {n: p.grad.detach().cpu() for n, p in model.named_parameters() if p.grad is not None}
    return logits.detach().cpu(), grads


def _generate(model: Any, ids: Any, cache: str, compiled: bool) -> list[list[int]]:
    kwargs: dict[str, Any] = dict(max_new_tokens=_NEW_TOKENS, min_new_tokens=_NEW_TOKENS, do_sample=False)
    if cache == "static":
        kwargs["cache_implementation"] = "static"
    if not compiled:
        kwargs["disable_compile"] = True
    prompt = ids[:1, : _SEQ // 2]
    out = model.generate(prompt, attention_mask=prompt.new_ones(prompt.shape), **kwargs)
    return out.cpu().tolist()


def _relative_error(a: Any, b: Any) -> float:
    """max |a - b| over the tolerance allowed for b (<= 1 passes)."""
    import torch

    if a.shape != b.shape:
        return float("inf")
    a, b = a.double(), b.double()
    if not torch.isfinite(b).all():
        same = torch.equal(torch.isfinite(a), torch.isfinite(b))
        finite = torch.isfinite(b)
        a, b = a[finite], b[finite]
        if not same:
            return float("inf")
    if b.numel() == 0:
        return 0.0
    allowed = _ATOL + _RTOL * float(b.abs().max())
    return float((a - b).abs().max()) / allowed


def _without_zero_only(grads: dict[str, Any], other: dict[str, Any]) -> dict[str, Any]:
    """``grads`` without the all-zero gradients of parameters that have none in ``other``."""
    return {name: g for name, g in grads.items() if name in other or bool(g.any())}


def _compare(cpu: tuple[Any, ...], dev: tuple[Any, ...]) -> tuple[str, str]:
    """(status, detail) of a device run (logits, grads, tokens) against the CPU reference."""
    logits_cpu, grads_cpu, tokens_cpu = cpu
    logits_dev, grads_dev, tokens_dev = dev
    logits_err = _relative_error(logits_dev, logits_cpu)
    # A parameter the loss does not reach has no gradient in eager mode, but an all-zero one
    # from a compiled graph (AOTAutograd differentiates the whole graph, unused outputs
    # included; CPU Inductor does the same). Both mean "no gradient".
    grads_cpu, grads_dev = _without_zero_only(grads_cpu, grads_dev), _without_zero_only(grads_dev, grads_cpu)
    if set(grads_cpu) != set(grads_dev):
        return "mismatch", f"gradients for different parameters ({len(grads_cpu)} vs {len(grads_dev)})"
    grad_err, worst = 0.0, ""
    for name, g in grads_cpu.items():
        e = _relative_error(grads_dev[name], g)
        if e > grad_err:
            grad_err, worst = e, name
    same_shape = logits_dev.shape == logits_cpu.shape
    logits_abs = float((logits_dev.double() - logits_cpu.double()).abs().nan_to_num(0.0).max()) if same_shape else float("inf")
    detail = f"logits {logits_abs:.1e} abs ({logits_err:.2f} of tol), grads {grad_err:.2f} of tol"
    if logits_err > 1:
        return "mismatch", "logits differ: " + detail
    if grad_err > 1:
        return "mismatch", f"gradient of {worst} differs: " + detail
    if tokens_dev != tokens_cpu:
        return "mismatch", f"generated tokens differ: cpu {tokens_cpu} vs neuron {tokens_dev}; " + detail
    return "ok", detail


def _compare_with_cpu_inductor(result: ArchResult, pristine: Any, ids: Any, dev: tuple[Any, ...]) -> None:
    """Where compiled neuron differs from CPU eager: does CPU Inductor differ the same way?

    If neuron's compiled logits and gradients match ``torch.compile`` on the CPU (Inductor),
    the difference comes from Inductor's lowering, not from the device: status ``as-inductor``.
    """
    import torch

    try:
        torch._dynamo.reset()
        cpu_model = copy.deepcopy(pristine)
        logits, grads = _forward_backward(cpu_model, ids, call=torch.compile(cpu_model, dynamic=False))
        status, detail = _compare((logits, grads, dev[2]), dev)
    except Exception as err:  # noqa: BLE001 - the check is extra information only
        result.compiled_detail += f"; CPU Inductor check failed: {_short_error(err)}"
        return
    if status == "ok":
        result.compiled = "as-inductor"
        result.compiled_detail += f"; equal to CPU Inductor ({detail}): Inductor differs from eager the same way"
    else:
        result.compiled_detail += f"; CPU Inductor differs too, but not the same way ({detail})"


def run_architecture(arch: str, compiled: bool = False, on_cpu_done: Any = None) -> ArchResult:
    """Runs one architecture on the CPU, then on neuron (eager, and compiled if asked).

    ``on_cpu_done(result)`` is called once the CPU reference exists, before any neuron work.
    """
    import torch
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    result = ArchResult(arch=arch, model_class=MODEL_FOR_CAUSAL_LM_MAPPING_NAMES.get(arch, ""))
    start = time.monotonic()
    try:
        model = _build(arch)
        result.params = sum(p.numel() for p in model.parameters())
        vocab = model.get_output_embeddings().weight.shape[0] if model.get_output_embeddings() is not None else 256
        ids = _inputs(vocab)
        pristine = copy.deepcopy(model)
        logits, grads = _forward_backward(model, ids)
        try:
            tokens = _generate(model, ids, "static", compiled=False)
        except Exception:  # noqa: BLE001 - the CPU cannot use a static cache here: compare dynamic
            result.cache = "dynamic"
            tokens = _generate(model, ids, "dynamic", compiled=False)
        reference = (logits, grads, tokens)
        result.cpu = "ok"
        if on_cpu_done is not None:
            on_cpu_done(result)
    except Exception as err:  # noqa: BLE001
        result.detail = _short_error(err)
        result.seconds = time.monotonic() - start
        return result

    try:
        dev_model = copy.deepcopy(pristine).to("neuron")
        dev_ids = ids.to("neuron")
        dev_logits, dev_grads = _forward_backward(dev_model, dev_ids)
        dev_tokens = _generate(dev_model, dev_ids, result.cache, compiled=False)
        result.neuron, result.neuron_detail = _compare(reference, (dev_logits, dev_grads, dev_tokens))
    except Exception as err:  # noqa: BLE001
        result.neuron, result.neuron_detail = "fail", _short_error(err)
        _log_traceback(arch, "neuron")

    if compiled:
        try:
            torch._dynamo.reset()
            dev_model = copy.deepcopy(pristine).to("neuron")
            dev_ids = ids.to("neuron")
            compiled_call = torch.compile(dev_model, backend="neuron", dynamic=False)
            dev_logits, dev_grads = _forward_backward(dev_model, dev_ids, call=compiled_call)
            dev_tokens = _generate(dev_model, dev_ids, result.cache, compiled=True)
            result.compiled, result.compiled_detail = _compare(reference, (dev_logits, dev_grads, dev_tokens))
            if result.compiled == "mismatch" and dev_tokens == tokens:
                _compare_with_cpu_inductor(result, pristine, ids, (dev_logits, dev_grads, dev_tokens))
        except Exception as err:  # noqa: BLE001
            result.compiled, result.compiled_detail = "fail", _short_error(err)
            _log_traceback(arch, "compiled")
    result.seconds = time.monotonic() - start
    return result


def _log_traceback(arch: str, column: str) -> None:
    sys.stderr.write(f"--- {arch} ({column}) ---\n{traceback.format_exc()}\n")
    sys.stderr.flush()


# -- workers -----------------------------------------------------------------------------------------


def _worker(compiled: bool) -> None:
    """Reads architecture names from stdin, writes one marked JSON result line per name."""
    import warnings

    import torch
    import transformers

    warnings.filterwarnings("ignore")
    transformers.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()
    if os.environ.get("NEURON_HF_COVERAGE_THREADS"):
        torch.set_num_threads(int(os.environ["NEURON_HF_COVERAGE_THREADS"]))
    import transformers.models.auto.modeling_auto  # noqa: F401 - imports done before the first timer starts

    sys.stdout.write(_MARK + json.dumps({"ready": True}) + "\n")
    sys.stdout.flush()
    for line in sys.stdin:
        arch = line.strip()
        if not arch:
            continue
        result = run_architecture(arch, compiled=compiled, on_cpu_done=lambda r: _emit(r, partial=True))
        _emit(result, partial=False)


def _emit(result: ArchResult, partial: bool) -> None:
    payload = dict(dataclasses.asdict(result), partial=partial)
    sys.stdout.write(_MARK + json.dumps(payload) + "\n")
    sys.stdout.flush()


class _WorkerProcess:
    """One worker subprocess; replaced when it crashes or an architecture times out."""

    def __init__(self, compiled: bool, threads: int | None, log_dir: str) -> None:
        env = dict(os.environ, HF_HUB_OFFLINE="1", TOKENIZERS_PARALLELISM="false")
        if threads:
            env["NEURON_HF_COVERAGE_THREADS"] = str(threads)
        args = [sys.executable, "-m", "neuron_hf.coverage", "--worker"] + (["--compiled"] if compiled else [])
        self._stderr = tempfile.NamedTemporaryFile(  # noqa: SIM115 - closed in stop()
            "w", prefix="coverage-worker-", suffix=".log", dir=log_dir, delete=False)
        self.stderr_path = self._stderr.name
        self.proc = subprocess.Popen(args, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self._stderr,
                                     text=True, bufsize=1, env=env)
        self.lines: queue.Queue[str | None] = queue.Queue()
        self.ready = False
        threading.Thread(target=self._read, daemon=True).start()

    def _wait_ready(self, timeout: float = _STARTUP_TIMEOUT) -> bool:
        """Waits for the worker's imports (not counted in any architecture's time)."""
        try:
            line = self.lines.get(timeout=timeout)
        except queue.Empty:
            return False
        self.ready = line is not None and json.loads(line).get("ready", False)
        return self.ready

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            if line.startswith(_MARK):
                self.lines.put(line[len(_MARK):])
        self.lines.put(None)

    def run(self, arch: str, timeout: float) -> ArchResult:
        assert self.proc.stdin is not None
        if not self.ready and not self._wait_ready():
            self.stop()
            return ArchResult(arch=arch, detail=f"worker did not start: {self._last_error()}")
        try:
            self.proc.stdin.write(arch + "\n")
            self.proc.stdin.flush()
        except BrokenPipeError:
            return ArchResult(arch=arch, detail="worker died before the architecture ran")
        deadline = time.monotonic() + timeout
        partial: ArchResult | None = None
        while True:
            try:
                line = self.lines.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                self.stop()
                return self._failed(arch, partial, f"timed out after {timeout:.0f} s")
            if line is None:
                code = self.proc.wait()
                self.stop()
                return self._failed(arch, partial, f"worker crashed (exit code {code}): {self._last_error()}")
            payload = json.loads(line)
            result = ArchResult(**{k: v for k, v in payload.items() if k != "partial"})
            if not payload["partial"]:
                return result
            partial = result

    @staticmethod
    def _failed(arch: str, partial: ArchResult | None, reason: str) -> ArchResult:
        """The result of an architecture whose worker hung or died, blaming the stage it was in."""
        if partial is None:
            return ArchResult(arch=arch, cpu="fail", detail=f"{reason} (on the CPU)")
        partial.neuron, partial.neuron_detail = "fail", f"{reason} (on neuron)"
        return partial

    def _last_error(self) -> str:
        try:
            with open(self.stderr_path) as f:
                lines = [ln.strip() for ln in f.read().splitlines() if ln.strip()]
        except OSError:
            return ""
        return lines[-1][:200] if lines else ""

    def alive(self) -> bool:
        return self.proc.poll() is None

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        self._stderr.close()


def run_coverage(
    archs: Sequence[str], compiled: bool = False, jobs: int = 1, timeout: float = 180.0, progress: bool = True,
    on_result: Any = None,
) -> list[ArchResult]:
    """Runs every architecture in ``jobs`` worker processes; results in the order of ``archs``.

    ``on_result(result)`` is called (under a lock) as each architecture finishes.
    """
    todo: queue.Queue[str] = queue.Queue()
    for arch in archs:
        todo.put(arch)
    results: dict[str, ArchResult] = {}
    lock = threading.Lock()
    log_dir = tempfile.mkdtemp(prefix="neuron-hf-coverage-")
    threads = 1 if jobs > 1 else None

    def drive() -> None:
        worker: _WorkerProcess | None = None
        while True:
            try:
                arch = todo.get_nowait()
            except queue.Empty:
                break
            if worker is None or not worker.alive():
                worker = _WorkerProcess(compiled, threads, log_dir)
            result = worker.run(arch, timeout)
            if not worker.alive():
                worker = None
            with lock:
                results[arch] = result
                if on_result is not None:
                    on_result(result)
                if progress:
                    sys.stderr.write(f"[{len(results)}/{len(archs)}] {arch}: cpu {result.cpu}, neuron {result.neuron}"
                                     + (f", compiled {result.compiled}" if compiled else "")
                                     + f" ({result.seconds:.1f} s)\n")
        if worker is not None:
            worker.stop()

    pool = [threading.Thread(target=drive) for _ in range(max(1, jobs))]
    for t in pool:
        t.start()
    for t in pool:
        t.join()
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    for result in results.values():
        result.model_class = result.model_class or MODEL_FOR_CAUSAL_LM_MAPPING_NAMES.get(result.arch, "")
    return [results[a] for a in archs]


# -- report ------------------------------------------------------------------------------------------


def _cell(status: str) -> str:
    return {"ok": "ok", "mismatch": "**mismatch**", "fail": "**fail**", "skip": "-",
            "as-inductor": "as CPU Inductor"}.get(status, status)


def _summary(results: Iterable[ArchResult], column: str) -> tuple[int, int]:
    cpu_ok = [r for r in results if r.cpu == "ok"]
    return sum(getattr(r, column) == "ok" for r in cpu_ok), len(cpu_ok)


def render_markdown(results: Sequence[ArchResult], command: str, compiled: bool,
                    not_run: Sequence[str] = ()) -> str:
    """The coverage table as markdown, with the command that produced it and a summary."""
    import torch
    import transformers

    cpu_ok = sum(r.cpu == "ok" for r in results)
    neuron_ok, base = _summary(results, "neuron")
    lines = [
        "# Architecture coverage: causal LMs on neuron vs the CPU",
        "",
        f"Produced by `{command}` on {time.strftime('%Y-%m-%d')} "
        f"(transformers {transformers.__version__}, torch {torch.__version__}); "
        "`nox -s hf_coverage` runs `python -m neuron_hf.coverage --jobs 2`.",
        "",
        "Each architecture in transformers' `MODEL_FOR_CAUSAL_LM_MAPPING_NAMES` is built tiny from its default "
        "config (hidden 64, 2 layers, 4 heads, 2 KV heads, vocab 256, small MoE/MLA/SSM dims), in float32 with "
        "the same weights on both devices; then forward, backward of a cross-entropy loss, and greedy generate "
        f"of {_NEW_TOKENS} tokens with the static cache (dynamic where the CPU cannot use a static cache). "
        f"Pass: logits and every gradient within {_ATOL:g} + {_RTOL:g} x max|CPU value|, generated tokens equal. "
        "Errors are given as a fraction of that tolerance.",
        "",
        f"* architectures: {len(results)}; working on the CPU: {cpu_ok}"
        + (f" (and {len(not_run)} not run yet: {', '.join(not_run)})" if not_run else ""),
        f"* neuron eager: **{neuron_ok}/{base}** of those working on the CPU"
        + (f" ({100 * neuron_ok / base:.1f}%)" if base else ""),
    ]
    if compiled:
        comp_ok, _ = _summary(results, "compiled")
        lines.append(f"* neuron compiled (`torch.compile(backend=\"neuron\")`): **{comp_ok}/{base}**"
                     + (f" ({100 * comp_ok / base:.1f}%)" if base else ""))
        as_inductor = sum(r.cpu == "ok" and r.compiled == "as-inductor" for r in results)
        if as_inductor:
            lines.append(f"* of the others, {as_inductor} differ from CPU eager exactly as CPU Inductor "
                         "(`torch.compile` on the CPU) does: \"as CPU Inductor\" below, not counted as passing")
    header = ("| architecture | class | parameters | CPU | neuron eager |" + (" neuron compiled |" if compiled else "")
              + " generate cache | max error / failure reason |")
    lines += ["", header, "|" + "---|" * (header.count("|") - 1)]
    for r in results:
        if r.cpu != "ok":
            reason = r.detail
        else:
            reason = r.neuron_detail
            if compiled and r.compiled != "ok":
                reason += f"; compiled: {r.compiled_detail}"
        reason = reason.replace("|", "\\|").replace("\n", " ")
        params = f"{r.params / 1e3:.0f}k" if r.params else "-"
        row = f"| {r.arch} | {r.model_class} | {params} | {_cell(r.cpu)} | {_cell(r.neuron)} |"
        if compiled:
            row += f" {_cell(r.compiled)} |"
        row += f" {r.cache if r.cpu == 'ok' else '-'} | {reason} |"
        lines.append(row)
    return "\n".join(lines) + "\n"


def _load_journal(path: str, compiled: bool) -> dict[str, ArchResult]:
    """Results already recorded in a ``--resume`` journal (JSON lines) for the same columns."""
    done: dict[str, ArchResult] = {}
    if not os.path.exists(path):
        return done
    fields = {f.name for f in dataclasses.fields(ArchResult)}
    with open(path) as f:
        for line in f:
            try:
                entry = json.loads(line)
            except json.JSONDecodeError:
                continue  # a line cut short by a killed run: that architecture runs again
            if entry.pop("_compiled", None) != compiled:
                continue
            result = ArchResult(**{k: v for k, v in entry.items() if k in fields})
            done[result.arch] = result
    return done


def _journal_writer(path: str, compiled: bool) -> Any:
    def write(result: ArchResult) -> None:
        with open(path, "a") as f:
            f.write(json.dumps({**dataclasses.asdict(result), "_compiled": compiled}) + "\n")
            f.flush()
            os.fsync(f.fileno())

    return write


def _default_output() -> str:
    here = os.path.abspath(os.getcwd())
    return os.path.join(here, "docs", "architecture_coverage.md")


def main(argv: Sequence[str] | None = None) -> int:
    """Command line: see the module docstring."""
    parser = argparse.ArgumentParser(prog="python -m neuron_hf.coverage", description=__doc__.splitlines()[0])
    parser.add_argument("archs", nargs="*", help="model types (default: every causal-LM model type)")
    parser.add_argument("--compiled", action="store_true", help='add a torch.compile(backend="neuron") column')
    parser.add_argument("--jobs", type=int, default=1, help="worker processes (default 1)")
    parser.add_argument("--timeout", type=float, default=180.0, help="seconds per architecture (default 180)")
    parser.add_argument("--output", default=None, help="markdown file, '-' for stdout (default docs/architecture_coverage.md)")
    parser.add_argument("--json", default=None, help="also write the raw results as JSON to this file")
    parser.add_argument("--resume", default=None, metavar="JOURNAL",
                        help="JSON-lines journal: architectures already in it are not run again, new results are "
                             "appended as they finish (lets a long --compiled run go in pieces)")
    parser.add_argument("--report-only", action="store_true",
                        help="with --resume: write the table from the journal without running anything "
                             "(architectures not in it are listed as not run yet)")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        _worker(args.compiled)
        return 0
    archs = args.archs or all_architectures()
    done = _load_journal(args.resume, args.compiled) if args.resume else {}
    if args.report_only:
        if not args.resume:
            parser.error("--report-only needs --resume JOURNAL")
        archs, not_run = [a for a in archs if a in done], [a for a in archs if a not in done]
    else:
        not_run = []
    todo = [a for a in archs if a not in done]
    if done:
        sys.stderr.write(f"{len(archs) - len(todo)} architectures taken from {args.resume}, {len(todo)} to run\n")
    on_result = _journal_writer(args.resume, args.compiled) if args.resume else None
    fresh = {r.arch: r for r in run_coverage(todo, compiled=args.compiled, jobs=args.jobs, timeout=args.timeout,
                                             on_result=on_result)}
    results = [fresh[a] if a in fresh else done[a] for a in archs]
    command = "python -m neuron_hf.coverage " + " ".join(argv if argv is not None else sys.argv[1:])
    text = render_markdown(results, command.strip(), args.compiled, not_run)
    output = args.output or _default_output()
    if output == "-":
        sys.stdout.write(text)
    else:
        os.makedirs(os.path.dirname(os.path.abspath(output)), exist_ok=True)
        with open(output, "w") as f:
            f.write(text)
        sys.stderr.write(f"wrote {output}\n")
    if args.json:
        with open(args.json, "w") as f:
            json.dump([dataclasses.asdict(r) for r in results], f, indent=1)
    neuron_ok, base = _summary(results, "neuron")
    sys.stderr.write(f"neuron eager: {neuron_ok}/{base} of the architectures working on the CPU\n")
    if args.compiled:
        compiled_ok, _ = _summary(results, "compiled")
        sys.stderr.write(f"neuron compiled: {compiled_ok}/{base} of the architectures working on the CPU\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
