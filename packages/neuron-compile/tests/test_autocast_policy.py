"""Compiled code under ``torch.autocast("neuron")`` applies neuron's cast policy, as eager does.

The lowering traces on CPU tensors, whose autocast policy differs from neuron's (the CPU runs
softmax, layer_norm, sum, exp... in the low precision dtype; neuron, like CUDA, in float32).
Every op of PyTorch's own autocast test lists must give the same dtype compiled as eager.
"""

from __future__ import annotations

from collections.abc import Callable
import warnings
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from torch.testing._internal.autocast_test_lists import AutocastTestLists

_LISTS = ("torch_fp16", "torch_fp32", "torch_need_autocast_promote", "nn_fp16", "nn_fp32",
          "linalg_fp16", "methods_fp16", "methods_fp32")
_MODULES = {"nn_fp16": torch._C._nn, "nn_fp32": torch._C._nn, "linalg_fp16": torch._C._linalg}


def _calls() -> list[tuple[str, Callable[..., Any], tuple[Any, ...], dict[str, Any]]]:
    """(name, function, args, kwargs) for each op of the autocast test lists, on neuron."""
    torch.manual_seed(0)
    lists = AutocastTestLists(torch.device("neuron"))
    calls = []
    for list_name in _LISTS:
        for entry in getattr(lists, list_name):
            op, args = entry[0], entry[1]
            extra = entry[2] if len(entry) > 2 else None
            # Skipped on ROCm; cuDNN's own entry points; and an einsum entry PyTorch itself skips
            # (its third item, the operands, is read as a true skip flag).
            if extra is True or op.startswith("cudnn") or not isinstance(args, tuple):
                continue
            kwargs = extra if isinstance(extra, dict) else {}
            if list_name.startswith("methods"):
                function = getattr(torch.Tensor, op)
            else:
                function = getattr(_MODULES.get(list_name, torch), op)
            calls.append((f"{list_name}.{op}", function, args, kwargs))
    return calls


def _dtypes(value: Any) -> list[torch.dtype]:
    return [leaf.dtype for leaf in torch.utils._pytree.tree_leaves(value) if isinstance(leaf, torch.Tensor)]


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_every_autocast_listed_op_compiles_to_the_eager_dtype(fresh_compiler, dtype):
    calls = []
    for call in _calls():
        try:
            with torch.autocast("neuron", dtype=dtype):
                call[1](*call[2], **call[3])
        except RuntimeError as error:  # float16 inputs under bfloat16 autocast: refused, as on CUDA
            assert dtype == torch.bfloat16 and "Unexpected floating ScalarType" in str(error), (call[0], error)
            continue
        calls.append(call)
    assert len(calls) > 80

    def run_all(calls: list[tuple[str, Callable[..., Any], tuple[Any, ...], dict[str, Any]]]) -> list[Any]:
        return [function(*args, **kwargs) for _, function, args, kwargs in calls]

    with torch.autocast("neuron", dtype=dtype):
        eager = run_all(calls)
        compiled = torch.compile(run_all, backend="neuron")(calls)
    differing = {name: (_dtypes(want), _dtypes(got))
                 for (name, *_), want, got in zip(calls, eager, compiled) if _dtypes(want) != _dtypes(got)}
    assert not differing, f"compiled dtypes differ from eager (eager, compiled): {differing}"
    for (name, *_), want, got in zip(calls, eager, compiled):
        for expected, actual in zip(torch.utils._pytree.tree_leaves(want), torch.utils._pytree.tree_leaves(got)):
            if isinstance(expected, torch.Tensor) and expected.is_floating_point():
                # Low precision sums of up to 512 products (the convolutions): a tolerance on the
                # output's scale, as CPU Inductor against CPU eager needs too.
                scale = float(expected.float().abs().nan_to_num(0, 0, 0).max()) if expected.numel() else 1.0
                torch.testing.assert_close(actual.float().cpu(), expected.float().cpu(), rtol=0,
                                           atol=3e-2 * max(scale, 1.0), equal_nan=True,
                                           msg=lambda text, name=name: f"{name}: {text}")


def test_softmax_and_layer_norm_stay_float32_in_a_compiled_training_step(fresh_compiler):
    # The case a model hits: Dynamo, which traces with neuron's rules, and the compiled program
    # must agree on the dtype of a graph output (here after a graph break), and the gradients
    # must follow the same casts as eager.
    torch.manual_seed(0)
    linear = torch.nn.Linear(16, 16).to("neuron")
    norm = torch.nn.LayerNorm(16).to("neuron")

    def step(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        probabilities = F.softmax(linear(x), -1)
        torch._dynamo.graph_break()
        return probabilities, norm(probabilities @ linear.weight)

    x = torch.randn(4, 16, device="neuron")
    results = {}
    for name, function in (("eager", step), ("compiled", torch.compile(step, backend="neuron"))):
        with torch.autocast("neuron", dtype=torch.bfloat16):
            probabilities, normed = function(x)
        normed.float().square().sum().backward()
        results[name] = (probabilities, normed, linear.weight.grad.clone(), norm.weight.grad.clone())
        linear.zero_grad()
        norm.zero_grad()
    for expected, actual in zip(results["eager"], results["compiled"]):
        assert actual.dtype == expected.dtype
        torch.testing.assert_close(actual.float().cpu(), expected.float().cpu(), rtol=2e-2, atol=2e-2)
    assert results["compiled"][0].dtype == torch.float32  # softmax: float32 on neuron, as on CUDA
    assert results["compiled"][1].dtype == torch.float32  # layer_norm


@pytest.mark.parametrize("region", [torch.no_grad, torch.inference_mode])
def test_grad_mode_switches_inside_an_autocast_graph_are_kept(fresh_compiler, region):
    # Tracing on the device drops `torch.no_grad()` and `torch.inference_mode()` regions unless
    # recorded back: the target computed there must get no gradient, compiled as in eager.
    torch.manual_seed(0)
    weight = torch.randn(8, 8, device="neuron", requires_grad=True)

    def loss_fn(x: torch.Tensor) -> torch.Tensor:
        with region():
            target = F.softmax(x @ weight, -1)
        return (F.softmax(x @ weight, -1) - target.clone() * 2).square().sum()

    x = torch.randn(4, 8, device="neuron")
    grads = []
    for function in (loss_fn, torch.compile(loss_fn, backend="neuron")):
        with torch.autocast("neuron", dtype=torch.bfloat16):
            loss = function(x)
        (grad,) = torch.autograd.grad(loss, weight)
        grads.append(grad)
    torch.testing.assert_close(grads[1].cpu(), grads[0].cpu(), rtol=2e-2, atol=2e-2)


def test_an_autocast_region_inside_compiled_code_follows_neuron_rules(fresh_compiler):
    # `with torch.autocast(...)` written inside the compiled function, including a CPU autocast
    # region, which must leave neuron tensors alone as it does in eager.
    a = torch.randn(8, 8, device="neuron")

    def f(a: torch.Tensor) -> tuple[torch.Tensor, ...]:
        with torch.autocast("neuron", dtype=torch.bfloat16):
            product = a @ a
            summed = product.sum()
            with torch.autocast("neuron", enabled=False):
                full = a @ a
        with torch.autocast("cpu", dtype=torch.bfloat16):
            untouched = a @ a
        return product, summed, full, untouched

    want = f(a)
    got = torch.compile(f, backend="neuron")(a)
    assert [t.dtype for t in want] == [torch.bfloat16, torch.float32, torch.float32, torch.float32]
    assert [t.dtype for t in got] == [t.dtype for t in want]
    for expected, actual in zip(want, got):
        torch.testing.assert_close(actual.float().cpu(), expected.float().cpu(), rtol=2e-2, atol=2e-2)


def test_views_recorded_on_the_device_survive_a_different_cpu_layout(fresh_compiler):
    # T5's attention concatenates an empty past with the new keys: traced on the device, the
    # result is contiguous and matmul records a `view` of it; Inductor's CPU decomposition of
    # `cat` keeps the non-empty input's transposed layout, which that view cannot take.
    torch.manual_seed(0)
    query = torch.randn(2, 2, 6, 8, device="neuron")
    new_keys = torch.randn(2, 6, 2, 8, device="neuron")

    def attention_scores(query: torch.Tensor, new_keys: torch.Tensor) -> torch.Tensor:
        keys = torch.cat([torch.tensor([], device=query.device), new_keys.transpose(1, 2)], dim=-2)
        return torch.matmul(query, keys.float().transpose(-2, -1) * 1.0).softmax(-1)

    with torch.autocast("neuron", dtype=torch.bfloat16):
        expected = attention_scores(query, new_keys)
        actual = torch.compile(attention_scores, backend="neuron")(query, new_keys)
    assert actual.dtype == expected.dtype == torch.float32
    torch.testing.assert_close(actual.cpu(), expected.cpu(), rtol=2e-2, atol=2e-2)


def test_in_place_updates_through_views_reach_their_base(fresh_compiler):
    # In-place writes through views, of an input and of a local buffer, reach their base when the
    # graph is traced on the device first, as in eager.
    torch.manual_seed(0)
    x = torch.randn(4, 4, device="neuron")

    def accumulate(buffer: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        flat = buffer.view(-1)
        flat.add_((x @ x).view(-1).float())
        local = torch.zeros(16, device=x.device)
        local.view(4, 4).copy_(x @ x)
        return local.view(4, 4).softmax(-1)

    buffers = [torch.zeros(4, 4, device="neuron") for _ in range(2)]
    with torch.autocast("neuron", dtype=torch.bfloat16):
        expected = accumulate(buffers[0], x)
        actual = torch.compile(accumulate, backend="neuron")(buffers[1], x)
    assert buffers[1].abs().sum() > 0
    torch.testing.assert_close(buffers[1].cpu(), buffers[0].cpu(), rtol=2e-2, atol=2e-2)
    torch.testing.assert_close(actual.cpu(), expected.cpu(), rtol=2e-2, atol=2e-2)


@torch._dynamo.config.patch(capture_scalar_outputs=True, capture_dynamic_output_shape_ops=True)
def test_data_dependent_sizes_under_autocast(fresh_compiler):
    # The device trace shares the lowering's shape environment, not Dynamo's: the sizes it reads
    # from data are named there, or the lowering's own trace reuses their names ("u1 possible
    # memo disaster").
    def rows_and_count(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        rows = (x @ x)[(x > 0).nonzero()[:, 0]].softmax(-1)
        count = int((x > 1).sum().item())
        return rows, torch.ones(count, device=x.device) @ torch.ones(count, device=x.device)

    compiled = torch.compile(rows_and_count, backend="neuron")
    torch.manual_seed(0)
    for _ in range(2):
        x = torch.randn(8, 8, device="neuron")
        with torch.autocast("neuron", dtype=torch.bfloat16):
            expected, actual = rows_and_count(x), compiled(x)
        for want, got in zip(expected, actual):
            assert got.dtype == want.dtype and got.shape == want.shape
            torch.testing.assert_close(got.float().cpu(), want.float().cpu(), rtol=2e-2, atol=2e-2)


def test_a_graph_the_device_trace_cannot_take_compiles_with_the_cpu_policy_and_a_warning(fresh_compiler, monkeypatch):
    from neuron_compile import _lowering

    def refuse(*args, **kwargs):
        raise NotImplementedError("no device trace for this construct")

    monkeypatch.setattr(_lowering, "with_device_casts", refuse)
    x = torch.randn(4, 8, device="neuron")

    def f(x: torch.Tensor) -> torch.Tensor:
        return (x @ x.t()).sum(-1)

    with torch.autocast("neuron", dtype=torch.bfloat16):
        expected = f(x)
        with pytest.warns(RuntimeWarning, match="could not trace this graph on the device under autocast"):
            actual = torch.compile(f, backend="neuron")(x)
    assert expected.dtype == torch.float32  # neuron: sum in float32
    assert actual.dtype == torch.bfloat16  # the CPU's policy: sum in bfloat16
    torch.testing.assert_close(actual.float().cpu(), expected.cpu(), rtol=2e-2, atol=5e-2)


_CONSTANT_SCRIPT = """
    import torch
    from neuron_compile import metrics
    x = torch.arange(8, dtype=torch.float32, device="neuron").reshape(2, 4)
    scale = lambda x: (x @ x.t()) * torch.tensor([[2.0, 0.5]], device=x.device) + torch.tensor(1.0)
    with torch.autocast("neuron", dtype=torch.bfloat16):
        out = torch.compile(scale, backend="neuron")(x)
    print("SOURCE", [graph.source for graph in metrics.graphs()])
    print("OUT", out.float().cpu().tolist(), out.dtype)
"""


def test_an_autocast_graph_with_tensor_constants_loads_from_the_cache(tmp_path):
    # The device trace turns `torch.tensor(data)` into constants attached to the graph; the
    # serialised program then expected them as extra inputs, and a process loading it from the
    # cache failed with "not enough values to unpack".
    from conftest import run_python_lines

    env = {"TORCH_NEURONX_NEFF_CACHE_DIR": str(tmp_path / "neff")}
    runs = [run_python_lines(_CONSTANT_SCRIPT, env=env) for _ in range(2)]
    assert [run["SOURCE"] for run in runs] == ["['compiled']", "['disk']"]
    assert runs[0]["OUT"] == runs[1]["OUT"]
    assert runs[0]["OUT"].endswith("torch.float32")  # the bfloat16 product, promoted by the constant


class _StraightThroughRound(torch.autograd.Function):
    """A custom backward that is not the derivative of the forward (the gradient of round is 0)."""

    @staticmethod
    def forward(ctx, x: torch.Tensor) -> torch.Tensor:  # noqa: ANN001
        return torch.round(x * 4) / 4

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> torch.Tensor:  # noqa: ANN001
        return grad * 3


def test_a_custom_autograd_function_keeps_its_backward_under_autocast(fresh_compiler):
    # A trace below autograd would replace the Function's own backward by the derivative of its
    # forward (zero here); such graphs are lowered with the CPU's policy instead, and say so.
    weight = torch.randn(8, 8, device="neuron", requires_grad=True)

    def f(x: torch.Tensor) -> torch.Tensor:
        return _StraightThroughRound.apply(x @ weight)

    x = torch.randn(4, 8, device="neuron")
    grads = []
    for function in (f, torch.compile(f, backend="neuron")):
        with torch.autocast("neuron", dtype=torch.bfloat16), warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            out = function(x)
        out.float().sum().backward()
        grads.append(weight.grad)
        weight.grad = None
    assert any("torch.autograd.Function" in str(warning.message) for warning in caught)
    assert grads[1].abs().sum() > 0
    torch.testing.assert_close(grads[1].cpu(), grads[0].cpu(), rtol=2e-2, atol=2e-2)
