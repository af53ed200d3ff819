"""Ops ATen routes differently for a custom device: convolution, SDPA, integer histc, dropout."""

from __future__ import annotations

import copy
import io
import subprocess
import sys

import pytest
import torch
import torch.nn.functional as F


@pytest.mark.parametrize("dims, transposed", [(1, False), (2, False), (3, False), (2, True)])
def test_convolution_forward_backward_matches_cpu(dims, transposed):
    torch.manual_seed(0)
    shape = (2, 4) + (6,) * dims
    x = torch.randn(shape, requires_grad=True)
    conv_cls = {1: torch.nn.Conv1d, 2: torch.nn.Conv2d, 3: torch.nn.Conv3d}[dims]
    if transposed:
        conv_cls = torch.nn.ConvTranspose2d
    conv = conv_cls(4, 3, 3, padding=1, groups=1)
    y = conv(x)
    y.square().sum().backward()
    xn = x.detach().to("neuron").requires_grad_()
    conv_n = conv_cls(4, 3, 3, padding=1).to("neuron")
    conv_n.load_state_dict(conv.state_dict())
    yn = conv_n(xn)
    yn.square().sum().backward()
    torch.testing.assert_close(yn.cpu(), y)
    torch.testing.assert_close(xn.grad.cpu(), x.grad)
    torch.testing.assert_close(conv_n.weight.grad.cpu(), conv.weight.grad)
    torch.testing.assert_close(conv_n.bias.grad.cpu(), conv.bias.grad)


def test_depthwise_conv1d_like_ssm_models():
    x = torch.randn(2, 8, 16)
    w = torch.randn(8, 1, 4)
    expected = F.conv1d(x, w, padding=3, groups=8)
    got = F.conv1d(x.neuron(), w.neuron(), padding=3, groups=8)
    torch.testing.assert_close(got.cpu(), expected)


def test_sdpa_matches_cpu_exactly():
    q, k, v = (torch.randn(2, 4, 16, 8) for _ in range(3))
    expected = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    got = F.scaled_dot_product_attention(q.neuron(), k.neuron(), v.neuron(), is_causal=True)
    assert got.cpu().equal(expected)


def test_integer_histc_like_cuda():
    experts = torch.tensor([0, 1, 1, 3, 3, 3], device="neuron")
    counts = torch.histc(experts, bins=4, min=0, max=3)
    assert counts.dtype == torch.int64 and counts.cpu().tolist() == [1, 2, 0, 3]
    floats = torch.histc(torch.tensor([0.5, 1.5], device="neuron"), bins=2, min=0, max=2)
    assert floats.cpu().tolist() == [1.0, 1.0]


def test_grouped_mm_for_moe():
    a = torch.randn(4, 8, dtype=torch.bfloat16)
    b = torch.randn(2, 8, 16, dtype=torch.bfloat16)
    offs = torch.tensor([2, 4], dtype=torch.int32)
    expected = torch._grouped_mm(a, b, offs=offs)
    got = torch._grouped_mm(a.neuron(), b.neuron(), offs=offs.neuron())
    torch.testing.assert_close(got.cpu(), expected)


def test_grouped_mm_accepts_what_the_cpu_accepts():
    # Transposed expert weights of an odd size (intermediate size 37, as in transformers' tiny
    # MoE test configs): ATen's generic kernel applied CUDA's rules to every device but the
    # CPU, so neuron refused what the CPU computes.
    a = torch.randn(10, 32)
    w = torch.randn(4, 37, 32).transpose(1, 2)
    offs = torch.tensor([3, 5, 8, 10], dtype=torch.int32)
    expected = torch._grouped_mm(a, w, offs=offs)
    got = torch._grouped_mm(a.neuron(), w.neuron(), offs=offs.neuron())
    torch.testing.assert_close(got.cpu(), expected)


def test_import_does_not_initialise_the_device(python_in_subprocess):
    result = python_in_subprocess(
        "import torch\nprint(torch.neuron.is_available(), torch.neuron.is_initialized())\n"
        "torch.ones(1, device='neuron')\nprint(torch.neuron.is_initialized())\n"
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["True", "False", "True"]


def test_conjugate_views_copy_without_recursion():
    x = torch.randn(4, dtype=torch.complex64)
    assert x.conj().neuron().cpu().equal(x.conj().resolve_conj())
    assert x.neuron().conj().clone().cpu().equal(x.conj().resolve_conj())
    torch.testing.assert_close(torch.fft.ifft(x.neuron()).cpu(), torch.fft.ifft(x))


def test_zero_tensor_gradients():
    y = torch.randn(3, device="neuron", requires_grad=True)
    torch.sgn(y).sum().backward()
    assert y.grad.cpu().equal(torch.zeros(3))
    z = torch._efficientzerotensor(3, device="neuron")
    assert z._is_zerotensor() and (z + 1).cpu().equal(torch.ones(3))


def test_sdpa_with_a_mask_that_requires_grad_matches_cpu():
    """The kernel choice sees requires_grad: the CPU's flash kernel cannot differentiate a mask."""
    import torch.nn.functional as F

    torch.manual_seed(0)
    q = torch.randn(1, 2, 4, 8)
    mask = torch.randn(1, 2, 4, 4)
    grads = {}
    for device in ("cpu", "neuron"):
        q_d = q.clone().to(device).requires_grad_()
        mask_d = mask.clone().to(device).requires_grad_()
        F.scaled_dot_product_attention(q_d, q_d, q_d, attn_mask=mask_d).sum().backward()
        grads[device] = (q_d.grad.cpu(), mask_d.grad.cpu())
    torch.testing.assert_close(grads["neuron"], grads["cpu"])


_DENSE_ONLY = "strided \\(dense\\) tensors only"


def test_sparse_and_quantized_tensors_are_refused_with_what_to_do():
    indices, values = torch.tensor([[0, 1], [1, 0]]), torch.tensor([1.0, 2.0])
    refused = {
        "sparse_coo_tensor on neuron": lambda: torch.sparse_coo_tensor(indices, values, (2, 2), device="neuron"),
        "sparse tensor moved to neuron": lambda: torch.sparse_coo_tensor(indices, values, (2, 2)).to("neuron"),
        "to_sparse of a neuron tensor": lambda: torch.ones(2, 2, device="neuron").to_sparse(),
        "to_sparse_csr of a neuron tensor": lambda: torch.ones(2, 2, device="neuron").to_sparse_csr(),
        "quantize a neuron tensor": lambda: torch.quantize_per_tensor(torch.ones(3, device="neuron"), 0.1, 0, torch.qint8),
        "quantized empty on neuron": lambda: torch._empty_affine_quantized(
            [2], scale=0.1, zero_point=0, dtype=torch.qint8, device="neuron"),
    }
    for name, make in refused.items():
        with pytest.raises((NotImplementedError, RuntimeError), match=_DENSE_ONLY):
            make()
    dense = torch.sparse_coo_tensor(indices, values, (2, 2)).to_dense().to("neuron")
    assert torch.equal(dense.cpu(), torch.tensor([[0.0, 1.0], [2.0, 0.0]]))


def test_composites_that_pick_a_kernel_by_device_run_as_on_cpu():
    """conj_physical_ calls a DispatchStub directly and mode(out=) allow-lists CPU/CUDA/XPU."""
    x = torch.randn(6, dtype=torch.cfloat)
    for make in (lambda t: t.clone().conj_physical_(), lambda t: t.clone().conj().conj_physical_()):
        assert torch.equal(make(x.to("neuron")).resolve_conj().cpu(), make(x).resolve_conj())
    cube = torch.randint(0, 3, (4, 5, 6)).float()
    values, indices = torch.empty(0, device="neuron"), torch.empty(0, dtype=torch.long, device="neuron")
    torch.mode(cube.to("neuron"), out=(values, indices))
    expected = torch.mode(cube)
    assert torch.equal(values.cpu(), expected.values) and torch.equal(indices.cpu(), expected.indices)


def test_cpu_scalar_output_of_a_neuron_op_is_a_device_mismatch():
    """A 0-d CPU tensor may be an input next to neuron tensors (as on CUDA), never the output."""
    a, b = torch.randn((), device="neuron"), torch.randn((), device="neuron")
    assert (a + torch.tensor(2.0)).device.type == "neuron"
    for compute in (lambda out: torch.add(a, b, out=out), lambda out: torch.acos(a, out=out),
                    lambda out: torch.sum(torch.randn(3, 5, device="neuron"), dim=(0, 1), out=out)):
        with pytest.raises(RuntimeError, match="same device.*neuron:0 and cpu"):
            compute(torch.empty(()))


def test_strided_nested_tensors_are_refused_with_what_to_use():
    nested = torch.nested.nested_tensor([torch.rand(2, 4), torch.rand(3, 4)], device="neuron")
    with pytest.raises(NotImplementedError, match="nested tensors are not supported.*torch.jagged"):
        torch.relu(nested)
    nested = torch.nested.nested_tensor([torch.rand(2, 4), torch.rand(3, 4)])
    with pytest.raises(NotImplementedError, match="nested tensors are not supported.*torch.jagged"):
        nested.to("neuron")


def test_packing_neuron_tensors_that_require_grad_is_refused_not_aborted():
    # Built from inputs requiring grad, a strided nested neuron tensor aborted the process:
    # autograd reads its nested sizes in a noexcept function, and that read is refused.
    code = (
        "import torch\n"
        "parts = [torch.randn(n, 3, device='neuron', requires_grad=True) for n in (2, 4)]\n"
        "try:\n"
        "    torch.nested.as_nested_tensor(parts)\n"
        "except NotImplementedError as error:\n"
        "    print('refused:', error)\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr[-2000:]
    assert "refused: neuron: aten::_nested_tensor_from_tensor_list: nested tensors are not supported" in result.stdout


@pytest.mark.parametrize("batch_first", [True, False])
@pytest.mark.parametrize("final_norm", [False, True])
@pytest.mark.parametrize("float_mask", [False, True])
def test_transformer_encoder_fast_path_matches_the_cpu_nested_path(batch_first, final_norm, float_mask):
    # In eval mode with a padding mask the encoder packs its input into a strided nested tensor
    # on its fast-path devices, neuron included; that failed. It now runs dense on neuron, with
    # the nested path's result: padded positions zero before the final norm.
    torch.manual_seed(0)
    layer = torch.nn.TransformerEncoderLayer(8, 2, 16, 0.0, batch_first=batch_first)
    norm = torch.nn.LayerNorm(8) if final_norm else None
    cpu = torch.nn.TransformerEncoder(layer, 2, norm=norm).eval()
    assert cpu.use_nested_tensor == batch_first  # torch packs batch-first inputs only
    neuron = copy.deepcopy(cpu).to("neuron")
    x = torch.randn(3, 5, 8) if batch_first else torch.randn(5, 3, 8)
    mask = torch.tensor([[False] * 5, [False, False, False, True, True], [False, True, True, True, True]])
    if float_mask:
        mask = torch.zeros(3, 5).masked_fill(mask, float("-inf"))
    with torch.no_grad():
        expected = cpu(x, src_key_padding_mask=mask)  # the CPU takes the nested path
        got = neuron(x.to("neuron"), src_key_padding_mask=mask.to("neuron"))
    torch.testing.assert_close(got.cpu(), expected, rtol=1e-5, atol=1e-5)
    assert neuron.use_nested_tensor == batch_first and (neuron.norm is None) == (norm is None)  # restored
    # Training mode (no fast path) is untouched and still matches.
    cpu.train(), neuron.train()
    torch.testing.assert_close(neuron(x.to("neuron"), src_key_padding_mask=mask.to("neuron")).detach().cpu(),
                               cpu(x, src_key_padding_mask=mask).detach(), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("device", ["cpu", "neuron"])
def test_transformers_still_script_with_the_encoder_fast_path_patched(device):
    # The encoder's replacement forward (above) made torch.jit.script of any nn.TransformerEncoder
    # or nn.Transformer fail, on every device ("try blocks aren't supported"); TorchScript now
    # compiles torch's own forward, and the scripted module saves and matches eager.
    torch.manual_seed(0)
    model = torch.nn.Transformer(8, 2, 1, 1, 16, 0.0, batch_first=True).eval().to(device)
    scripted = torch.jit.script(model)
    assert "_nested_tensor_from_mask" in scripted.encoder.code  # torch's source, not the patch
    src, tgt = torch.randn(2, 5, 8, device=device), torch.randn(2, 3, 8, device=device)
    with torch.no_grad():
        torch.testing.assert_close(scripted(src, tgt), model(src, tgt))
    buffer = io.BytesIO()
    torch.jit.save(scripted, buffer)
    buffer.seek(0)
    loaded = torch.jit.load(buffer, map_location=device)
    with torch.no_grad():
        torch.testing.assert_close(loaded(src, tgt), model(src, tgt))


def _jagged(lengths, heads, dim, device, seed):
    generator = torch.Generator().manual_seed(seed)
    parts = [torch.randn(n, heads, dim, generator=generator) for n in lengths]
    return torch.nested.nested_tensor([p.to(device) for p in parts], layout=torch.jagged,
                                      requires_grad=True)


@pytest.mark.parametrize("kv_lengths", [None, (4, 9, 2)], ids=["self", "cross"])
def test_attention_on_jagged_nested_tensors_matches_the_cpu(kv_lengths):
    # In the (B, H, j, D) layout torch's NJT attention repacks its inputs as strided nested
    # tensors off CUDA; on neuron that failed with "operator aten::stride does not exist".
    q_lengths = (5, 3, 7)
    kv_lengths = kv_lengths or q_lengths
    results = {}
    for device in ("cpu", "neuron"):
        q = _jagged(q_lengths, 4, 8, device, 0)
        k, v = _jagged(kv_lengths, 4, 8, device, 1), _jagged(kv_lengths, 4, 8, device, 2)
        out = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2))
        assert out.is_nested and out.shape[1] == 4 and out.device.type == device
        out = out.transpose(1, 2)
        (out.values() * torch.arange(out.values().numel(), device=device).view_as(out.values())).sum().backward()
        results[device] = [out.values()] + [t.grad.values() for t in (q, k, v)]
        assert out.offsets().tolist() == q.offsets().tolist()
    for got, expected in zip(results["neuron"], results["cpu"]):
        torch.testing.assert_close(got.detach().cpu(), expected.detach(), rtol=1e-5, atol=1e-4)


@pytest.mark.parametrize("device", ["cpu", "neuron"])
def test_attention_with_a_dense_query_and_jagged_keys_gets_torchs_error(device):
    # The runtime's NJT attention read the query's ragged dimension before torch's validation,
    # so a dense query raised AttributeError instead of torch's ValueError (on the CPU too).
    keys = _jagged((3, 5), 2, 8, device, 0).transpose(1, 2)
    with pytest.raises(ValueError, match="Expected query, key, and value to be nested tensors"):
        F.scaled_dot_product_attention(torch.randn(2, 2, 4, 8, device=device), keys, keys)


def test_assigning_cpu_values_into_a_neuron_tensor_is_refused_as_on_cuda():
    # index_put_ took any CPU values into a neuron tensor, a script that fails on a real
    # device (ATen's TensorIterator refuses it; FakeTensor and torch.compile did too).
    x = torch.zeros(3, 4, device="neuron")
    index = torch.tensor([2, 0])
    with pytest.raises(RuntimeError, match=r"same device.*neuron:0 and cpu.*'values' of"):
        x[index] = torch.ones(2, 4)
    with pytest.raises(RuntimeError, match=r"same device.*neuron:0 and cpu"):
        torch.index_put(x, (index.to("neuron"),), torch.ones(4), accumulate=True)
    with pytest.raises(RuntimeError, match=r"same device.*neuron:0 and cpu"):
        x[x > 0] = torch.ones(1, 1)[0, :1].expand(0)  # empty, not one element
    assert x.eq(0).all().item()
    # Allowed, as on CUDA: a 0-dim CPU value, a one-element CPU value filling a mask on the
    # device (ATen's masked_fill path), and values on the device.
    x[index] = torch.tensor(2.0)
    x[x.eq(0)] = torch.tensor([3.0])
    x[index.to("neuron")] = torch.full((2, 4), 4.0, device="neuron")
    expected = torch.full((3, 4), 3.0)
    expected[index] = 4.0
    assert x.cpu().equal(expected)


def test_dot_of_a_zero_tensor_as_on_the_cpu():
    # dot and vdot leave ZeroTensors to their kernels; the fallback viewed one as bytes it does
    # not have ("data is not allocated yet"), which broke forward-mode AD through dot, inner,
    # 1-D matmul and tensordot (undefined tangents are ZeroTensors).
    import torch.autograd.forward_ad as fwAD

    y = torch.randn(5, device="neuron")
    zero = torch._efficientzerotensor(5, device="neuron")
    for result in (torch.dot(zero, y), torch.vdot(y, zero), torch.inner(zero, y)):
        assert result._is_zerotensor() and result.device.type == "neuron"
        assert result.cpu().item() == 0.0
    x = torch.randn(5)
    with fwAD.dual_level():
        dual = fwAD.make_dual(x.to("neuron"), torch._efficientzerotensor(5, device="neuron"))
        out = torch.dot(dual, y)
        assert out.cpu().item() == pytest.approx(torch.dot(x, y.cpu()).item(), rel=1e-6)
        assert fwAD.unpack_dual(out).tangent.cpu().item() == 0.0
    with pytest.raises(RuntimeError, match="ZeroTensors are immutable"):
        zero.add_(1)


def test_indexing_a_cpu_tensor_with_neuron_indices_is_refused_as_in_aten():
    # The neuron index routed the op to the device, which moved the CPU tensor there silently.
    x = torch.randn(3, 4)
    index = torch.tensor([2, 0])
    with pytest.raises(RuntimeError, match=r"indices should be either on cpu or on the same device as the indexed tensor \(cpu\)"):
        x[index.to("neuron")]
    with pytest.raises(RuntimeError, match=r"indexed tensor \(cpu\)"):
        x[index, index.to("neuron")[:1].expand(2)]
    with pytest.raises(RuntimeError, match=r"indexed tensor \(neuron:0\)"):
        x.to("neuron:0")[index.to("neuron:1")]
    # Allowed, as on CUDA: CPU or same-device indices into a neuron tensor.
    on_device = x.to("neuron")
    assert on_device[index].cpu().equal(x[index])
    assert on_device[index.to("neuron")].cpu().equal(x[index])
    on_device[index] = 0.0
    assert on_device.cpu()[index].eq(0).all()


@pytest.mark.parametrize("factory", ["empty", "empty_like", "empty_strided", "new_empty"])
def test_deterministic_mode_fills_new_memory_like_the_cpu(factory):
    make = {
        "empty": lambda d: torch.empty(64, device=d),
        "empty_like": lambda d: torch.empty_like(torch.zeros(64, device=d)),
        "empty_strided": lambda d: torch.empty_strided((8, 8), (1, 8), device=d),
        "new_empty": lambda d: torch.zeros(1, device=d).new_empty(64),
    }[factory]
    previous = torch.are_deterministic_algorithms_enabled()
    torch.use_deterministic_algorithms(True)
    try:
        blocks = [torch.full((64,), 7.0, device="neuron") for _ in range(4)]
        del blocks  # leave non-NaN bytes in the cache for the next allocation
        assert make("neuron").isnan().all()
        assert torch.empty(16, dtype=torch.int32, device="neuron").eq(torch.iinfo(torch.int32).max).all()
    finally:
        torch.use_deterministic_algorithms(previous)


def _causal(batch, head, q_index, kv_index):
    return q_index >= kv_index


def test_flex_attention_eager_forward_backward_matches_sdpa_on_cpu():
    """torch's flex attention refused neuron tensors (a fixed device list); its eager path is generic."""
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention

    torch.manual_seed(0)
    q, k, v = (torch.randn(2, 4, 128, 16) for _ in range(3))
    qn, kn, vn = (t.to("neuron").requires_grad_() for t in (q, k, v))
    qc, kc, vc = (t.clone().requires_grad_() for t in (q, k, v))
    mask = create_block_mask(_causal, 1, 1, 128, 128, device="neuron")
    out = flex_attention(qn, kn, vn, block_mask=mask)
    ref = F.scaled_dot_product_attention(qc, kc, vc, is_causal=True)
    torch.testing.assert_close(out.cpu(), ref)
    out.square().sum().backward()
    ref.square().sum().backward()
    for got, want in ((qn, qc), (kn, kc), (vn, vc)):
        torch.testing.assert_close(got.grad.cpu(), want.grad)


def test_flex_attention_score_mod_matches_cpu_and_cpu_rules_are_kept():
    from torch.nn.attention.flex_attention import flex_attention

    def bias(score, batch, head, q_index, kv_index):
        return score + (q_index - kv_index) * 0.05

    q, k, v = (torch.randn(1, 2, 64, 8) for _ in range(3))
    got = flex_attention(q.to("neuron"), k.to("neuron"), v.to("neuron"), score_mod=bias)
    torch.testing.assert_close(got.cpu(), flex_attention(q, k, v, score_mod=bias))
    with pytest.raises(NotImplementedError, match="backward on CPU"):  # torch's CPU rule, unchanged
        flex_attention(q.requires_grad_(), k, v)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_sync_batch_norm_kernels_match_batch_norm(dtype):
    # ATen has these only for CUDA; nn.SyncBatchNorm calls them (end to end on 2 ranks in neuron-dist).
    x = torch.randn(6, 3, 4, 4).to(dtype)
    weight, bias = torch.randn(3), torch.randn(3)
    mean, invstd = torch.batch_norm_stats(x.neuron(), 1e-5)
    assert mean.dtype == invstd.dtype == torch.float32  # CUDA's accumulate type
    var, ref_mean = torch.var_mean(x.float(), dim=(0, 2, 3), correction=0)
    torch.testing.assert_close(mean.cpu(), ref_mean)
    torch.testing.assert_close(invstd.cpu(), (var + 1e-5).rsqrt())
    counts = torch.tensor([96.0], device="neuron")
    g_mean, g_invstd = torch.batch_norm_gather_stats_with_counts(
        x.neuron(), mean[None], invstd[None], None, None, 0.1, 1e-5, counts)
    torch.testing.assert_close(g_mean.cpu(), ref_mean)
    torch.testing.assert_close(g_invstd.cpu(), (var + 1e-5).rsqrt())
    out = torch.batch_norm_elemt(x.neuron(), weight.neuron(), bias.neuron(), g_mean, g_invstd, 1e-5)
    expected = F.batch_norm(x.float(), ref_mean, var, weight, bias, training=False, eps=1e-5).to(dtype)
    assert out.dtype == dtype
    torch.testing.assert_close(out.cpu(), expected, **({} if dtype == torch.float32 else {"atol": 2e-2, "rtol": 2e-2}))
