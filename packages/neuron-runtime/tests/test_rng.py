"""Device generators: seeding, reproducibility, state save/restore, torch.Generator."""

from __future__ import annotations

import pytest
import torch


def test_seeded_runs_reproduce():
    torch.manual_seed(123)
    a = torch.randn(100, device="neuron")
    torch.manual_seed(123)
    b = torch.randn(100, device="neuron")
    assert a.cpu().equal(b.cpu())


def test_neuron_stream_matches_cpu_for_same_seed():
    torch.manual_seed(7)
    cpu = torch.rand(50)
    torch.manual_seed(7)
    dev = torch.rand(50, device="neuron")
    assert dev.cpu().equal(cpu)


def test_device_generator_is_independent_of_cpu():
    torch.manual_seed(0)
    torch.randn(10)  # advances only the CPU generator
    a = torch.randn(10, device="neuron")
    torch.manual_seed(0)
    b = torch.randn(10, device="neuron")
    assert a.cpu().equal(b.cpu())


def test_get_set_rng_state():
    torch.neuron.manual_seed(5)
    state = torch.neuron.get_rng_state()
    a = torch.rand(10, device="neuron")
    torch.neuron.set_rng_state(state)
    b = torch.rand(10, device="neuron")
    assert a.cpu().equal(b.cpu())
    states = torch.neuron.get_rng_state_all()
    assert len(states) == torch.neuron.device_count()
    torch.neuron.set_rng_state_all(states)


def test_set_rng_state_inside_a_fake_tensor_mode():
    """Restoring a real CPU state runs no tensor op: DTensor's sharding propagation restores
    states with a FakeTensorMode active, which refuses ops on real tensors."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    torch.neuron.manual_seed(11)
    state = torch.neuron.get_rng_state()
    expected = torch.rand(3, device="neuron")
    with FakeTensorMode():
        torch.neuron.set_rng_state(state)
    assert torch.equal(torch.rand(3, device="neuron"), expected)


def test_explicit_generator():
    g = torch.Generator("neuron")
    g.manual_seed(42)
    a = torch.randn(5, device="neuron", generator=g)
    g.manual_seed(42)
    b = torch.randn(5, device="neuron", generator=g)
    assert g.device.type == "neuron" and a.cpu().equal(b.cpu())


def test_dropout_and_inplace_random_ops():
    torch.manual_seed(1)
    x = torch.ones(1000, device="neuron")
    y = torch.nn.functional.dropout(x, 0.5)
    assert 300 < int((y == 0).sum()) < 700
    z = torch.empty(100, device="neuron").uniform_(2, 3)
    assert z.min() >= 2 and z.max() <= 3


@pytest.mark.parametrize("train", [True, False])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_native_dropout_matches_the_cpu_kernel_mask_dtype_included(train, dtype):
    # The training mask came back in the input's dtype (4x the memory autograd saves) where the
    # CPU and CUDA kernels return bool.
    x = torch.randn(64, 33).to(dtype)
    torch.manual_seed(7)
    cpu_out, cpu_mask = torch.ops.aten.native_dropout.default(x, 0.3, train)
    torch.manual_seed(7)
    out, mask = torch.ops.aten.native_dropout.default(x.to("neuron"), 0.3, train)
    assert mask.dtype == cpu_mask.dtype == torch.bool
    assert torch.equal(mask.cpu(), cpu_mask) and torch.equal(out.cpu(), cpu_out)


def test_cpu_generator_for_neuron_op_errors():
    with pytest.raises(RuntimeError, match="Expected a 'neuron' device type for generator"):
        torch.randn(3, device="neuron", generator=torch.Generator())


def test_initial_seed_and_seed():
    torch.neuron.manual_seed(99)
    assert torch.neuron.initial_seed() == 99
    torch.neuron.manual_seed_all(3)
    assert all(torch.neuron.default_generators[i].initial_seed() == 3 for i in range(torch.neuron.device_count()))


def test_dropout_uses_the_device_generator_and_restores_with_state():
    x = torch.ones(64, device="neuron")
    torch.neuron.manual_seed(3)
    state = torch.neuron.get_rng_state()
    a = torch.nn.functional.dropout(x, 0.5)
    torch.randn(5)  # CPU draws must not affect the device stream
    torch.neuron.set_rng_state(state)
    b = torch.nn.functional.dropout(x, 0.5)
    assert a.cpu().equal(b.cpu())


@pytest.mark.parametrize("op", [
    "uniform_", "normal_", "exponential_", "bernoulli", "multinomial", "randn", "randperm",
])
def test_neuron_generator_for_cpu_tensors_errors(op):
    # The generator alone routed the op to the device: CPU tensors were filled from the neuron
    # stream, and multinomial of CPU probabilities returned a neuron tensor.
    g = torch.Generator("neuron").manual_seed(0)
    call = {
        "uniform_": lambda: torch.empty(4).uniform_(generator=g),
        "normal_": lambda: torch.empty(4).normal_(generator=g),
        "exponential_": lambda: torch.empty(4).exponential_(generator=g),
        "bernoulli": lambda: torch.bernoulli(torch.full((4,), 0.5), generator=g),
        "multinomial": lambda: torch.multinomial(torch.ones(4), 2, generator=g),
        "randn": lambda: torch.randn(4, generator=g),
        "randperm": lambda: torch.randperm(4, generator=g),
    }[op]
    with pytest.raises(RuntimeError, match="Expected a 'cpu' device type for generator but found 'neuron'"):
        call()
    # With the tensors on the device the same generator is accepted.
    assert torch.randn(4, generator=g, device="neuron").device.type == "neuron"
    assert torch.empty(4, device="neuron").uniform_(generator=g).device.type == "neuron"


class _DropoutBlock(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.linear = torch.nn.Linear(64, 64)
        self.dropout = torch.nn.Dropout(0.5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.dropout(torch.relu(self.linear(x)))


@pytest.mark.parametrize("use_reentrant", [True, False])
def test_checkpointing_recomputes_the_same_dropout_mask_as_the_cpu(use_reentrant):
    # torch.utils.checkpoint saves and restores a device's RNG state only if
    # ``torch.neuron._initialized`` is true; it was missing, so the recomputed forward drew a
    # different dropout mask and gradients were silently wrong.
    from torch.utils.checkpoint import checkpoint

    grads = {}
    for device in ("cpu", "neuron"):
        torch.manual_seed(0)
        block = _DropoutBlock().to(device)
        x = torch.randn(32, 64).to(device).requires_grad_()
        torch.manual_seed(1)
        out = checkpoint(block, x, use_reentrant=use_reentrant)
        (out * out).sum().backward()
        grads[device] = [t.detach().cpu() for t in (out, x.grad, block.linear.weight.grad)]
    for got, expected in zip(grads["neuron"], grads["cpu"]):
        torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-6)


def test_the_device_module_reports_initialisation_as_torch_cuda_does():
    torch.empty(1, device="neuron")
    assert torch.neuron._initialized is True
    with pytest.raises(AttributeError, match="no attribute 'no_such_name'"):
        torch.neuron.no_such_name  # noqa: B018


def test_default_generators_index_as_a_tuple_like_torch_cuda():
    # [-1] returned the current core's generator, not the last core's; slices raised TypeError
    # and a core past the last raised RuntimeError instead of IndexError.
    count = torch.neuron.device_count()
    generators = torch.neuron.default_generators
    torch.neuron.set_device(1)
    try:
        assert generators[-1].device == torch.device("neuron", count - 1)
        assert [g.device.index for g in generators[1:3]] == [1, 2]
        assert len(generators) == count and generators[0].device.index == 0
        with pytest.raises(IndexError):
            generators[count]
    finally:
        torch.neuron.set_device(0)


def test_set_rng_state_takes_only_a_cpu_byte_tensor_as_torch_cuda():
    # Other dtypes and device-resident states were converted silently; torch.cuda passes the
    # state to the generator, which refuses anything but a CPU ByteTensor.
    state = torch.neuron.get_rng_state()
    for bad in (state.long(), state.float(), state.to("neuron")):
        with pytest.raises(TypeError, match="RNG state must be a torch.ByteTensor"):
            torch.neuron.set_rng_state(bad)
    torch.neuron.set_rng_state(state)
    first = torch.randn(4, device="neuron").cpu()
    torch.neuron.set_rng_state(torch.stack([state, state], 1)[:, 0])  # non-contiguous: accepted
    assert torch.randn(4, device="neuron").cpu().equal(first)
