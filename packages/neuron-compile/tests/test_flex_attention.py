"""Compiled flex attention: training graphs compile (Inductor's CPU template is inference only)."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from conftest import run_python_lines
from neuron_compile import metrics


def _causal(batch, head, q_index, kv_index):
    return q_index >= kv_index


def test_compiled_flex_attention_trains_and_matches_sdpa_on_cpu(fresh_compiler):
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention

    torch.manual_seed(0)
    q, k, v = (torch.randn(2, 4, 128, 16) for _ in range(3))
    qn, kn, vn = (t.to("neuron").requires_grad_() for t in (q, k, v))
    qc, kc, vc = (t.clone().requires_grad_() for t in (q, k, v))
    mask = create_block_mask(_causal, 1, 1, 128, 128, device="neuron")
    out = torch.compile(flex_attention, backend="neuron")(qn, kn, vn, block_mask=mask)
    ref = F.scaled_dot_product_attention(qc, kc, vc, is_causal=True)
    torch.testing.assert_close(out.cpu(), ref)
    out.square().sum().backward()
    ref.square().sum().backward()
    for got, want in ((qn, qc), (kn, kc), (vn, vc)):
        torch.testing.assert_close(got.grad.cpu(), want.grad)
    flex_graphs = [record for record in metrics.graphs() if record.name.startswith("flex_attention")]
    assert [(record.source, record.reason) for record in flex_graphs] == [("compiled", "")], \
        "compiled and persisted, not run eagerly"


_SCRIPT = """
    import torch
    from torch.nn.attention.flex_attention import flex_attention
    from neuron_compile import metrics
    torch.manual_seed(0)
    q, k, v = (torch.randn(1, 2, 64, 8, device="neuron") for _ in range(3))
    bias = lambda score, b, h, q_index, kv_index: score + (q_index - kv_index) * 0.05
    with torch.no_grad():
        out = torch.compile(flex_attention, backend="neuron")(q, k, v, score_mod=bias)
        ref = flex_attention(q.cpu(), k.cpu(), v.cpu(), score_mod=bias)
    print("SOURCE", [r.source for r in metrics.graphs()])
    print("DIFF", (out.cpu() - ref).abs().max().item())
"""


def test_compiled_flex_attention_persists_across_processes(tmp_path):
    env = {"TORCH_NEURONX_NEFF_CACHE_DIR": str(tmp_path / "neff")}
    runs = [run_python_lines(_SCRIPT, env=env) for _ in range(2)]
    assert [run["SOURCE"] for run in runs] == ["['compiled']", "['disk']"]
    assert all(float(run["DIFF"]) < 1e-5 for run in runs)
