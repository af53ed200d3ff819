"""Device registration, indices, properties and the torch integration surface."""

from __future__ import annotations

import pytest
import torch


def test_plain_import_torch_registers_neuron():
    assert hasattr(torch, "neuron")
    assert torch.neuron.is_available()
    assert torch._C._get_privateuse1_backend_name() == "neuron"


def test_current_accelerator_is_neuron():
    assert torch.accelerator.current_accelerator().type == "neuron"
    assert torch.accelerator.device_count() == torch.neuron.device_count()
    assert torch._C._get_accelerator().type == "neuron"


def test_default_instance_is_trn2_with_four_logical_cores():
    assert torch.neuron.device_count() == 4
    props = torch.neuron.get_device_properties(0)
    assert props.name == "NeuronCore-v3" == torch.neuron.get_device_name()
    assert props.total_memory == 24 * 2**30
    assert torch.neuron.get_device_capability() == (3, 0)


def test_tensor_and_module_methods():
    x = torch.arange(6.0).neuron()
    assert x.is_neuron and x.device == torch.device("neuron", 0)
    m = torch.nn.Linear(3, 2).neuron()
    assert next(m.parameters()).device.type == "neuron"
    assert x.cpu().equal(torch.arange(6.0))


def test_set_device_and_device_context():
    assert torch.neuron.current_device() == 0
    with torch.neuron.device(2):
        assert torch.neuron.current_device() == 2
        assert torch.empty(1, device="neuron").device == torch.device("neuron", 2)
    assert torch.neuron.current_device() == 0


def test_device_context_restores_the_core_current_at_entry_as_torch_cuda_does():
    # Entered on the core already current, the context restored nothing: a set_device inside
    # the block leaked out of it. torch.cuda.device restores the core current at entry.
    torch.neuron.set_device(0)
    try:
        with torch.neuron.device(0):
            torch.neuron.set_device(2)
        assert torch.neuron.current_device() == 0
        with torch.neuron.device(1):
            torch.neuron.set_device(3)
        assert torch.neuron.current_device() == 0
        with torch.neuron.device_of(torch.ones(1, device="neuron:1")):
            assert torch.neuron.current_device() == 1
        with torch.neuron.device_of(torch.ones(1)):  # not on neuron: no change
            assert torch.neuron.current_device() == 0
        # A negative index is a no-op, as in torch.cuda (and torch.accelerator here).
        torch.neuron.set_device(-1)
        with torch.neuron.device(-1):
            assert torch.neuron.current_device() == 0
        assert torch.neuron.current_device() == 0
        with pytest.raises(RuntimeError, match="Invalid device index"):
            torch.neuron.set_device(torch.neuron.device_count())
    finally:
        torch.neuron.set_device(0)


def test_copy_between_cores():
    a = torch.randn(5, device="neuron:0")
    b = a.to("neuron:1")
    assert b.device.index == 1 and b.cpu().equal(a.cpu())


def test_invalid_device_index_error():
    with pytest.raises(RuntimeError, match=r"Invalid device index neuron:7.*4 visible NeuronCore"):
        torch.empty(1, device="neuron:7")
    with pytest.raises(RuntimeError, match="Invalid device index"):
        torch.neuron.set_device(9)


def test_two_devices_in_one_op_error():
    a = torch.ones(3, device="neuron:0")
    with pytest.raises(RuntimeError, match=r"same device.*neuron:0 and cpu"):
        a + torch.ones(3)
    with pytest.raises(RuntimeError, match=r"same device.*neuron:0 and neuron:1"):
        a + torch.ones(3, device="neuron:1")


def test_cpu_scalar_tensor_is_allowed_like_cuda():
    a = torch.ones(3, device="neuron")
    assert (a * torch.tensor(2.0)).cpu().equal(torch.full((3,), 2.0))


def test_cpu_index_tensor_is_allowed_like_cuda():
    a = torch.arange(5.0, device="neuron")
    assert a[torch.tensor([0, 3])].cpu().equal(torch.tensor([0.0, 3.0]))


def test_numpy_on_neuron_tensor_errors():
    with pytest.raises(TypeError, match="neuron"):
        torch.ones(2, device="neuron").numpy()


def test_views_share_device_memory():
    a = torch.zeros(4, 4, device="neuron")
    row = a[1]
    row.fill_(3.0)
    t = a.t()
    assert t.untyped_storage().data_ptr() == a.untyped_storage().data_ptr()
    assert a.cpu()[1].eq(3).all() and t.cpu()[:, 1].eq(3).all()


def test_inplace_returns_same_tensor_and_out_resizes():
    a = torch.ones(3, device="neuron")
    assert a.add_(1) is a
    out = torch.empty(0, device="neuron")
    torch.add(torch.ones(5, device="neuron"), 1, out=out)
    assert out.shape == (5,) and out.cpu().eq(2).all()


def test_tied_weights_stay_tied_after_to():
    emb = torch.nn.Embedding(10, 4)
    head = torch.nn.Linear(4, 10, bias=False)
    head.weight = emb.weight
    model = torch.nn.ModuleDict({"emb": emb, "head": head}).to("neuron")
    assert model["emb"].weight is model["head"].weight
    assert model["emb"].weight.device.type == "neuron"


def test_no_copy_fallback_for_common_ops():
    import neuron_runtime

    neuron_runtime.reset_op_counts()
    x = torch.randn(8, 16, device="neuron", requires_grad=True)
    w = torch.randn(16, 4, device="neuron", requires_grad=True)
    y = torch.nn.functional.gelu(x @ w).softmax(-1).sum()
    y.backward()
    assert neuron_runtime.get_fallback_ops() == {}


def test_storage_resize():
    s = torch.ones(4, device="neuron").untyped_storage()
    s.resize_(64)
    assert s.nbytes() == 64 and s.device.type == "neuron"


@pytest.mark.filterwarnings("ignore:TypedStorage is deprecated")
@pytest.mark.parametrize("dtype, name", [(torch.float32, "FloatStorage"), (torch.int64, "LongStorage"),
                                         (torch.bool, "BoolStorage"), (torch.bfloat16, "BFloat16Storage")])
def test_legacy_typed_storages_like_torch_cuda(dtype, name):
    """``storage_type()`` returned None on neuron: torch looks the class up on the device module."""
    x = torch.ones(6, dtype=dtype, device="neuron")
    legacy = getattr(torch.neuron, name)
    assert x.storage_type() is legacy
    assert x.storage().type() == f"torch.neuron.{name}"
    assert isinstance(x.storage(), legacy) and not isinstance(x.cpu().storage(), legacy)
    assert not isinstance(torch.ones(6, device="neuron", dtype=torch.int8).storage(), legacy)
    assert torch.is_storage(x.storage())
    made = legacy(3)
    assert (made.device, made.dtype, made.size()) == (torch.device("neuron", torch.neuron.current_device()), dtype, 3)


@pytest.mark.filterwarnings("ignore:TypedStorage is deprecated")
def test_legacy_storage_from_values_and_errors():
    assert torch.neuron.FloatStorage([1.5, 2.5]).tolist() == [1.5, 2.5]
    assert torch.neuron.FloatStorage([1.5, 2.5]).device.type == "neuron"
    with pytest.raises(RuntimeError, match="from_buffer: not available for neuron storage"):
        torch.neuron.FloatStorage.from_buffer(b"\0" * 8, "native")
    with pytest.raises(RuntimeError, match="Device of 'wrap_storage' must be neuron"):
        torch.neuron.FloatStorage(wrap_storage=torch.ones(2).untyped_storage())


def test_structured_ops_route_straight_to_cpu_kernels():
    has = torch._C._dispatch_has_kernel_for_dispatch_key
    for op in ("aten::add.Tensor", "aten::mul.Tensor", "aten::add_.Tensor", "aten::gelu"):
        assert has(op, "PrivateUse1"), op


@pytest.mark.parametrize("op", ["add", "sub", "mul", "div"])
def test_arithmetic_fast_path_matches_cpu_and_checks_devices(op):
    a, b = torch.randn(4, 5), torch.randn(4, 5)
    fn = getattr(torch, op)
    torch.testing.assert_close(fn(a.neuron(), b.neuron()).cpu(), fn(a, b))
    torch.testing.assert_close(fn(a.neuron(), torch.tensor(3.0)).cpu(), fn(a, torch.tensor(3.0)))
    inplace = a.neuron()
    assert getattr(inplace, op + "_")(b.neuron()) is inplace
    torch.testing.assert_close(inplace.cpu(), fn(a, b))
    with pytest.raises(RuntimeError, match="same device"):
        fn(a.neuron(), b)
    with pytest.raises(RuntimeError, match="same device"):
        fn(a.neuron(), b.to("neuron:1"))


def test_cat_fast_path_matches_cpu_and_checks_devices():
    a, b = torch.randn(2, 3), torch.randn(4, 3)
    assert torch.cat([a.neuron(), b.neuron()]).cpu().equal(torch.cat([a, b]))
    assert torch.cat([a.t().neuron(), b.t().neuron()], dim=1).cpu().equal(torch.cat([a.t(), b.t()], dim=1))
    with pytest.raises(RuntimeError, match="neuron:0 and cpu"):
        torch.cat([a.neuron(), b])
    with pytest.raises(RuntimeError, match="neuron:0 and neuron:1"):
        torch.cat([a.neuron(), b.to("neuron:1")])


def test_sum_fast_path_matches_cpu():
    x = torch.randn(4, 5)
    for fn in (lambda t: t.sum(), lambda t: t.sum(1), lambda t: t.sum((0, 1), keepdim=True),
               lambda t: t.int().sum(), lambda t: t.sum(dtype=torch.bfloat16)):
        expected, got = fn(x), fn(x.neuron())
        assert got.device.type == "neuron" and got.dtype == expected.dtype
        torch.testing.assert_close(got.cpu(), expected)
