"""Backward of neuron tensors runs on the thread that initialised the device (DeviceState.cpp:
``lazyInitDevice`` turns autograd multithreading off for that thread), not on PyTorch's
per-device autograd thread; processes that never use the device keep PyTorch's default."""

from __future__ import annotations

import threading

import pytest
import torch
import torch.utils.checkpoint

from neuron_runtime._config import load_config


def _backward_thread(device: str) -> tuple[int, torch.Tensor]:
    """(ident of the thread that accumulated the gradient, the gradient) of a small graph."""
    x = torch.arange(6.0, device=device).reshape(2, 3).requires_grad_()
    seen: list[int] = []
    x.register_hook(lambda grad: seen.append(threading.get_ident()))
    (torch.tanh(x) @ torch.ones(3, 2, device=device)).square().sum().backward()
    return seen[0], x.grad.cpu()


def test_backward_runs_on_the_calling_thread():
    torch.neuron.init()  # the test process's main thread initialised the device (or does now)
    assert not torch._C._is_multithreading_enabled()
    ident, grad = _backward_thread("neuron")
    assert ident == threading.get_ident()
    torch.testing.assert_close(grad, _backward_thread("cpu")[1])


def test_other_threads_keep_device_threads_and_match_the_cpu():
    result: dict[str, object] = {}

    def work() -> None:
        result["caller"] = threading.get_ident()
        result["ident"], result["grad"] = _backward_thread("neuron")

    worker = threading.Thread(target=work)
    worker.start()
    worker.join(timeout=60)
    assert not worker.is_alive()
    assert result["ident"] != result["caller"]  # PyTorch's default in threads started later
    torch.testing.assert_close(result["grad"], _backward_thread("cpu")[1])


def test_backward_on_a_non_current_core():
    assert torch.neuron.device_count() >= 2
    assert torch.neuron.current_device() == 0
    weight = torch.randn(4, 4, requires_grad=True)
    on_core = weight.detach().to("neuron:1").requires_grad_()
    (on_core.sin() @ on_core).sum().backward()
    (weight.sin() @ weight).sum().backward()
    assert on_core.grad.device == torch.device("neuron:1")
    assert torch.neuron.current_device() == 0
    torch.testing.assert_close(on_core.grad.cpu(), weight.grad)


@pytest.mark.parametrize("reentrant", [True, False])
def test_checkpointed_backward_matches_the_cpu(reentrant: bool):
    torch.manual_seed(0)
    layer = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.GELU(), torch.nn.Linear(16, 8))
    inputs = torch.randn(5, 8, requires_grad=True)
    grads = {}
    for device in ("cpu", "neuron"):
        model = layer.to(device)
        x = inputs.detach().to(device).requires_grad_()
        torch.utils.checkpoint.checkpoint(model, x, use_reentrant=reentrant).sum().backward()
        grads[device] = [x.grad.cpu()] + [p.grad.cpu() for p in model.parameters()]
        model.zero_grad(set_to_none=True)
    for neuron_grad, cpu_grad in zip(grads["neuron"], grads["cpu"]):
        torch.testing.assert_close(neuron_grad, cpu_grad)


_PROBE = """
    import os, threading, torch
    before = torch._C._is_multithreading_enabled()  # import torch alone changes nothing
    x = torch.ones(3, device="neuron", requires_grad=True)
    seen = []
    x.register_hook(lambda grad: seen.append(threading.get_ident()))
    (x * 2).sum().backward()
    print(before, seen[0] != threading.get_ident(), torch._C._is_multithreading_enabled(), flush=True)
    # PyTorch's device threads may still be dropping the hook's Python references while the
    # interpreter finalizes (a shutdown race of that mode, not of the runtime).
    os._exit(0)
"""


def test_first_use_moves_backward_to_the_calling_thread(python_in_subprocess):
    result = python_in_subprocess(_PROBE)
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["True", "False", "False"]


def test_device_threads_opt_in(python_in_subprocess):
    result = python_in_subprocess(_PROBE, {"TORCH_NEURONX_AUTOGRAD_DEVICE_THREADS": "1"})
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["True", "True", "True"]


def test_a_process_that_never_uses_the_device_keeps_the_default(python_in_subprocess):
    result = python_in_subprocess("""
        import torch
        x = torch.ones(3, requires_grad=True)
        (x * 2).sum().backward()
        print(torch.neuron.is_available(), torch._C._is_multithreading_enabled())
    """)
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["True", "True"]


def test_flag_is_parsed():
    assert not load_config({}).autograd_device_threads
    assert load_config({"TORCH_NEURONX_AUTOGRAD_DEVICE_THREADS": "1"}).autograd_device_threads
