"""PyTorch OpInfo conformance: every op in ``op_db`` on ``neuron`` against the CPU.

One test per (op variant, dtype, direction), id ``<op>[.<variant>]-<dtype>-<fwd|bwd>``:

* ``fwd``: each sample input (the first ``--opinfo-samples``, default 8) runs on the CPU and,
  moved to ``neuron`` with the same strides, on the device; outputs (after the OpInfo's
  ``output_process_fn_grad``, as PyTorch's own ``test_compare_cpu`` does) and the inputs
  afterwards (catches lost in-place writes) must match.
* ``bwd``: ``torch.autograd.grad`` of every differentiable output, with a fixed random
  upstream gradient, w.r.t. every floating input that requires grad, on both devices.

A sample whose CPU reference raises is not counted; a test with no CPU-valid sample is
skipped. Random ops are seeded identically on both devices (the neuron generator is the
CPU's Mersenne Twister) and compared by value; ops whose output is uninitialized memory
(``empty*``) are compared by shape/dtype/device only. ``expected_failures.txt`` lists known
failures (``<test id>  # reason``); they run as ``xfail(strict=True)``.

Without ``--opinfo-full`` (or ``NEURON_OPINFO_FULL=1``) only ``DEFAULT_OPS`` run.
Set ``NEURON_OPINFO_LOG=<path>`` to append one JSON line per test (used for docs/opinfo.md).
"""

from __future__ import annotations

import itertools
import json
import os
import pathlib
import subprocess
import sys
import traceback
import warnings

import pytest
import torch

from .conftest import opinfo_full, opinfo_samples

warnings.filterwarnings("ignore", message=".*Trainium hardware does not support.*")

with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    from torch.testing._internal.common_device_type import toleranceOverride
    from torch.testing._internal.common_methods_invocations import op_db
    from torch.testing._internal.opinfo.core import DecorateInfo

DEVICE = "neuron"
DTYPES = (torch.float32, torch.bfloat16)
DTYPE_NAMES = {torch.float32: "float32", torch.bfloat16: "bfloat16"}
SEED = 1234

# The representative subset run by default (every variant of each named OpInfo).
DEFAULT_OPS = frozenset("""
    add sub mul div matmul mm bmm addmm baddbmm mv einsum softmax log_softmax
    nn.functional.linear nn.functional.gelu nn.functional.silu nn.functional.relu
    nn.functional.layer_norm nn.functional.rms_norm nn.functional.group_norm
    nn.functional.batch_norm nn.functional.embedding nn.functional.cross_entropy
    nn.functional.nll_loss nn.functional.mse_loss nn.functional.dropout
    nn.functional.scaled_dot_product_attention nn.functional.conv2d nn.functional.pad
    nn.functional.max_pool2d nn.functional.avg_pool2d nn.functional.one_hot
    sum mean var std prod max min amax amin argmax argmin logsumexp linalg.vector_norm any all
    sort topk cumsum cat stack index_select gather scatter scatter_add index_put index_add
    masked_fill masked_select where nonzero clamp pow exp log sqrt rsqrt tanh sigmoid erf sin
    cos abs neg maximum minimum eq lt reshape view transpose permute t squeeze unsqueeze
    flatten expand repeat split chunk narrow flip roll tril triu clone contiguous to
    arange linspace zeros ones full zeros_like ones_like full_like randn rand_like bernoulli
    normal
""".split())

# Ops whose values are uninitialized memory: compare metadata only.
_UNINITIALIZED = ("empty", "new_empty")

# Base tolerances; an OpInfo's own toleranceOverride (for the tests that compare devices or
# variants) widens them.
_BASE_TOL = {
    torch.float32: (1.3e-6, 1e-5),
    torch.complex64: (1.3e-6, 1e-5),
    torch.float64: (1e-7, 1e-7),
    torch.complex128: (1e-7, 1e-7),
    torch.bfloat16: (1.6e-2, 1e-2),
    torch.float16: (1e-3, 1e-3),
}
_TOL_TESTS = (None, "test_compare_cpu", "test_variant_consistency_eager",
              "test_noncontiguous_samples", "test_out")

EXPECTED_FAILURES_FILE = pathlib.Path(__file__).with_name("expected_failures.txt")
# Expected failures whose reason starts with this tag crash the process (segfault, abort):
# they run in a fresh interpreter so the crash is reported as an ordinary failure.
CRASH_TAG = "[crash]"


def op_id(op) -> str:
    return op.name + (f".{op.variant_test_name}" if op.variant_test_name else "")


def load_expected_failures() -> dict[str, str]:
    failures: dict[str, str] = {}
    if not EXPECTED_FAILURES_FILE.exists():
        return failures
    for line in EXPECTED_FAILURES_FILE.read_text().splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        test_id, _, reason = line.partition("#")
        failures[test_id.strip()] = reason.strip() or "known failure"
    return failures


_EXPECTED = load_expected_failures()


def all_cases(full: bool):
    """(test id, op, dtype, direction) for every test, in op_db order."""
    for op in op_db:
        if not full and op.name not in DEFAULT_OPS:
            continue
        cpu_dtypes = op.supported_dtypes("cpu")
        bwd_dtypes = op.supported_backward_dtypes("cpu") if op.supports_autograd else set()
        for dtype in DTYPES:
            if dtype not in cpu_dtypes:
                continue
            name = f"{op_id(op)}-{DTYPE_NAMES[dtype]}"
            yield f"{name}-fwd", op, dtype, "fwd"
            if op.supports_autograd and dtype in bwd_dtypes:
                yield f"{name}-bwd", op, dtype, "bwd"


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "opinfo_case" not in metafunc.fixturenames:
        return
    expected = load_expected_failures()
    params = []
    for test_id, op, dtype, direction in all_cases(opinfo_full(metafunc.config)):
        marks = [pytest.mark.opinfo]
        if test_id in expected:
            marks.append(pytest.mark.xfail(strict=True, reason=expected[test_id]))
        params.append(pytest.param((op, dtype, direction), id=test_id, marks=marks))
    metafunc.parametrize("opinfo_case", params)


# --------------------------------------------------------------------------- moving samples

def _tensor_to_device(t: torch.Tensor, device: str) -> torch.Tensor:
    """The same values with the same sizes, strides and storage offset on ``device``."""
    src = t.detach()
    if src.layout != torch.strided or (src.is_contiguous() and src.storage_offset() == 0):
        out = src.to(device)
    else:
        numel = src.untyped_storage().nbytes() // src.element_size()
        flat = src.as_strided((numel,), (1,), 0).to(device)
        out = flat.as_strided(src.size(), src.stride(), src.storage_offset())
    if t.requires_grad:
        out.requires_grad_(True)
    return out


def _generator_to_device(g: torch.Generator, device: str) -> torch.Generator:
    ng = torch.Generator(device=device)
    ng.set_state(g.get_state())
    return ng


def to_device(value, device: str = DEVICE, key: str | None = None):
    """Recursively moves tensors (and device/generator arguments) to ``device``."""
    if isinstance(value, torch.Tensor):
        return _tensor_to_device(value, device)
    if isinstance(value, torch.device):
        return torch.device(device) if value.type == "cpu" else value
    if isinstance(value, str) and (value == "cpu" or value.startswith("cpu:")):
        return device
    if isinstance(value, torch.Generator):
        return _generator_to_device(value, device) if value.device.type == "cpu" else value
    if isinstance(value, tuple) and hasattr(value, "_fields"):
        return type(value)(*(to_device(v, device) for v in value))
    if isinstance(value, (list, tuple)):
        return type(value)(to_device(v, device) for v in value)
    if isinstance(value, dict):
        return {k: to_device(v, device, key=k) for k, v in value.items()}
    return value


def to_cpu(value):
    if isinstance(value, torch.Tensor):
        return value.detach().cpu()
    if isinstance(value, tuple) and hasattr(value, "_fields"):
        return type(value)(*(to_cpu(v) for v in value))
    if isinstance(value, (list, tuple)):
        return type(value)(to_cpu(v) for v in value)
    if isinstance(value, dict):
        return {k: to_cpu(v) for k, v in value.items()}
    return value


def flatten_tensors(value) -> list[torch.Tensor]:
    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, (list, tuple)):
        return [t for v in value for t in flatten_tensors(v)]
    if isinstance(value, dict):
        return [t for v in value.values() for t in flatten_tensors(v)]
    return []


def sample_parts(sample):
    return [sample.input, list(sample.args), dict(sample.kwargs)]


# Arguments that must stay on the CPU on every device (as on CUDA): op name -> predicate
# on (argument position, value); position 0 is the first positional argument after input.
_CPU_ONLY_ARGS = {
    "tensor_split": lambda pos, value: pos == 0,  # tensor_indices_or_sections
}


def parts_to_device(op, parts):
    inp, args, kwargs = parts
    keep = _CPU_ONLY_ARGS.get(op.name, lambda pos, value: False)
    dev_args = [a if isinstance(a, torch.Tensor) and keep(i, a) else to_device(a)
                for i, a in enumerate(args)]
    return [to_device(inp), dev_args, to_device(kwargs)]


# ------------------------------------------------------------------------------ comparing

def _tolerance_overrides(op) -> dict:
    overrides: dict = {}
    for info in op.decorators:
        if not isinstance(info, DecorateInfo):
            continue
        if info.cls_name not in (None, "TestCommon") or info.test_name not in _TOL_TESTS:
            continue
        if info.device_type not in (None, "cpu"):
            continue
        for dec in info.decorators:
            if isinstance(dec, toleranceOverride):
                for dt, tol in dec.d.items():
                    rtol, atol = overrides.get(dt, (0.0, 0.0))
                    overrides[dt] = (max(rtol, tol.rtol), max(atol, tol.atol))
    return overrides


def tolerance(op, input_dtype: torch.dtype, out_dtype: torch.dtype) -> tuple[float, float]:
    if not (out_dtype.is_floating_point or out_dtype.is_complex):
        return 0.0, 0.0
    rtol, atol = _BASE_TOL.get(out_dtype, _BASE_TOL[torch.float32])
    base_in = _BASE_TOL.get(input_dtype, (0.0, 0.0))
    over = _tolerance_overrides(op).get(input_dtype, (0.0, 0.0))
    return max(rtol, base_in[0], over[0]), max(atol, base_in[1], over[1])


def assert_same(actual, expected, *, op, dtype, metadata_only=False, path="output", check_device=True):
    """``actual`` came from neuron, ``expected`` from the CPU."""
    if isinstance(expected, torch.Tensor):
        assert isinstance(actual, torch.Tensor), f"{path}: expected a tensor, got {type(actual)}"
        if check_device and expected.device.type == "cpu":
            assert actual.device.type == DEVICE, (
                f"{path}: neuron op returned a tensor on {actual.device} (CPU returned cpu)")
        assert actual.dtype == expected.dtype, f"{path}: dtype {actual.dtype} != {expected.dtype}"
        assert actual.shape == expected.shape, f"{path}: shape {actual.shape} != {expected.shape}"
        assert actual.layout == expected.layout, f"{path}: layout {actual.layout} != {expected.layout}"
        if metadata_only:
            return
        rtol, atol = tolerance(op, dtype, expected.dtype)
        a, e = actual.detach().cpu(), expected.detach()
        if a.layout != torch.strided:
            a, e = a.to_dense(), e.to_dense()
        torch.testing.assert_close(a, e, rtol=rtol, atol=atol, equal_nan=True,
                                   msg=lambda m: f"{path}: {m}")
        return
    if isinstance(expected, (list, tuple)):
        assert isinstance(actual, (list, tuple)) and len(actual) == len(expected), (
            f"{path}: expected a sequence of {len(expected)}, got {type(actual)}")
        for i, (a, e) in enumerate(zip(actual, expected)):
            assert_same(a, e, op=op, dtype=dtype, metadata_only=metadata_only, path=f"{path}[{i}]",
                        check_device=check_device)
        return
    if isinstance(expected, dict):
        assert isinstance(actual, dict) and actual.keys() == expected.keys(), f"{path}: keys differ"
        for k in expected:
            assert_same(actual[k], expected[k], op=op, dtype=dtype, metadata_only=metadata_only,
                        path=f"{path}[{k!r}]", check_device=check_device)
        return
    if isinstance(expected, (bool, int, float, complex)) and not metadata_only:
        assert type(actual) is type(expected) or isinstance(actual, (int, float, complex)), (
            f"{path}: {type(actual)} != {type(expected)}")
        rtol, atol = _BASE_TOL[torch.float32] if isinstance(expected, (float, complex)) else (0, 0)
        torch.testing.assert_close(actual, expected, rtol=rtol, atol=atol, equal_nan=True)
        return
    if not metadata_only and not isinstance(expected, (torch.dtype, torch.device)):
        assert actual == expected, f"{path}: {actual!r} != {expected!r}"


# ----------------------------------------------------------------------------- running

def is_random(op) -> bool:
    name = op.name
    return any(k in name for k in ("rand", "normal", "bernoulli", "dropout", "multinomial",
                                   "uniform", "exponential", "geometric", "cauchy", "poisson",
                                   "rrelu", "gumbel", "fractional", "lowrank"))


def is_uninitialized(op) -> bool:
    return op.has_nondeterministic_output or op.name.startswith(_UNINITIALIZED)


def run(op, parts, seed):
    torch.manual_seed(seed)
    inp, args, kwargs = parts
    return op(inp, *args, **kwargs)


def differentiable(tensors):
    return [i for i, t in enumerate(tensors)
            if (t.dtype.is_floating_point or t.dtype.is_complex) and t.requires_grad]


def upstream_grads(outputs, seed):
    gen = torch.Generator().manual_seed(seed)
    return [torch.randn(o.shape, dtype=o.dtype, generator=gen) for o in outputs]


class CpuReferenceError(Exception):
    """The CPU reference raised: the sample does not count."""


def check_forward(op, dtype, sample, seed):
    cpu_parts = sample_parts(sample)
    dev_parts = parts_to_device(op, cpu_parts)
    try:
        expected = sample.output_process_fn_grad(run(op, cpu_parts, seed))
    except Exception as e:  # noqa: BLE001
        raise CpuReferenceError(repr(e)) from e
    actual = sample.output_process_fn_grad(run(op, dev_parts, seed))
    meta = is_uninitialized(op)
    assert_same(actual, expected, op=op, dtype=dtype, metadata_only=meta)
    # The inputs afterwards (in-place ops and out= style arguments must write device memory).
    assert_same(to_cpu(flatten_tensors(dev_parts)), flatten_tensors(cpu_parts), op=op, dtype=dtype,
                metadata_only=meta, path="inputs after the op", check_device=False)


def check_backward(op, dtype, sample, seed):
    cpu_parts = sample_parts(sample)
    dev_parts = parts_to_device(op, cpu_parts)
    cpu_in = flatten_tensors(cpu_parts)
    dev_in = flatten_tensors(dev_parts)
    in_idx = differentiable(cpu_in)
    try:
        if not in_idx:
            raise CpuReferenceError("no input requires grad")
        cpu_out = flatten_tensors(sample.output_process_fn_grad(run(op, cpu_parts, seed)))
        out_idx = [i for i in differentiable(cpu_out) if cpu_out[i].grad_fn is not None]
        if not out_idx:
            raise CpuReferenceError("no differentiable output")
        grads_out = upstream_grads([cpu_out[i] for i in out_idx], seed)
        expected = torch.autograd.grad([cpu_out[i] for i in out_idx], [cpu_in[i] for i in in_idx],
                                       grads_out, allow_unused=True)
    except CpuReferenceError:
        raise
    except Exception as e:  # noqa: BLE001
        raise CpuReferenceError(repr(e)) from e
    dev_out = flatten_tensors(sample.output_process_fn_grad(run(op, dev_parts, seed)))
    assert len(dev_out) == len(cpu_out), f"{len(dev_out)} outputs on neuron, {len(cpu_out)} on cpu"
    missing = [i for i in out_idx if dev_out[i].grad_fn is None]
    assert not missing, f"neuron outputs {missing} have no grad_fn"
    actual = torch.autograd.grad([dev_out[i] for i in out_idx], [dev_in[i] for i in in_idx],
                                 [g.to(DEVICE) for g in grads_out], allow_unused=True)
    for k, (a, e) in enumerate(zip(actual, expected)):
        if e is None:
            assert a is None, f"grad[{k}]: neuron produced a gradient, the CPU None"
            continue
        assert a is not None, f"grad[{k}]: neuron produced None, the CPU a gradient"
        assert_same(a, e, op=op, dtype=dtype, metadata_only=is_uninitialized(op),
                    path=f"grad of input {in_idx[k]}")


def describe(sample) -> str:
    def one(v):
        if isinstance(v, torch.Tensor):
            return f"T{list(v.shape)}"
        if isinstance(v, (list, tuple)):
            return "[" + ", ".join(one(x) for x in v) + "]"
        return repr(v)[:40]
    kw = ", ".join(f"{k}={one(v)}" for k, v in sample.kwargs.items())
    return f"input={one(sample.input)}, args={one(list(sample.args))}" + (f", {kw}" if kw else "")


def _log(record: dict) -> None:
    path = os.environ.get("NEURON_OPINFO_LOG")
    if not path:
        return
    worker = os.environ.get("PYTEST_XDIST_WORKER", "main")
    with open(f"{path}.{worker}", "a") as f:
        f.write(json.dumps(record) + "\n")


def run_in_subprocess(test_id: str, nsamples: int) -> None:
    """Runs one case in a fresh interpreter (no pytest collection): for ops that crash."""
    code = (f"import sys; sys.path.insert(0, {str(pathlib.Path(__file__).parents[1])!r}); "
            f"from opinfo.test_opinfo import run_case_by_id; run_case_by_id({test_id!r}, {nsamples})")
    env = dict(os.environ)
    env.pop("NEURON_OPINFO_LOG", None)
    proc = subprocess.run([sys.executable, "-X", "faulthandler", "-c", code], env=env,
                          capture_output=True, text=True, timeout=900)
    out = (proc.stdout + proc.stderr)[-3000:]
    if proc.returncode < 0 or "Fatal Python error" in out:
        sig = -proc.returncode if proc.returncode < 0 else proc.returncode
        first = next((ln for ln in out.splitlines() if "Fatal Python error" in ln), "")
        raise AssertionError(f"the op crashed the process (signal {sig}: {first}) in a subprocess")
    if proc.returncode != 0:
        raise AssertionError("failed in a subprocess:\n" + out[-1500:])


def run_case_by_id(test_id: str, nsamples: int) -> None:
    for case_id, op, dtype, direction in all_cases(True):
        if case_id == test_id:
            run_case(op, dtype, direction, test_id, nsamples)
            return
    raise LookupError(f"no OpInfo case {test_id}")


class NoValidSamples(Exception):
    pass


def run_case(op, dtype, direction, test_id: str, nsamples: int) -> None:
    check = check_forward if direction == "fwd" else check_backward
    torch.manual_seed(0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        samples = list(itertools.islice(
            op.sample_inputs("cpu", dtype, requires_grad=direction == "bwd"), nsamples))
    valid, cpu_errors = 0, 0
    for i, sample in enumerate(samples):
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                check(op, dtype, sample, SEED + i)
        except CpuReferenceError:
            cpu_errors += 1
            continue
        except BaseException as e:
            _log({"id": test_id, "outcome": "failed", "sample": i, "valid": valid,
                  "error": f"{type(e).__name__}: {e}"[:2000],
                  "where": "".join(traceback.format_exception(e)[-3:])[-1500:]})
            raise AssertionError(f"sample {i} ({describe(sample)}): {type(e).__name__}: {e}") from e
        valid += 1
    _log({"id": test_id, "outcome": "passed" if valid else "skipped", "valid": valid,
          "cpu_errors": cpu_errors, "samples": len(samples)})
    if not valid:
        raise NoValidSamples(f"no CPU-valid samples ({len(samples)} samples, {cpu_errors} CPU errors)")


def test_opinfo(opinfo_case, request):
    op, dtype, direction = opinfo_case
    test_id = request.node.callspec.id
    nsamples = opinfo_samples(request.config)
    if _EXPECTED.get(test_id, "").startswith(CRASH_TAG):
        _log({"id": test_id, "outcome": "failed", "error": "crash (run in a subprocess)"})
        run_in_subprocess(test_id, nsamples)
        return
    try:
        run_case(op, dtype, direction, test_id, nsamples)
    except NoValidSamples as e:
        pytest.skip(str(e))
