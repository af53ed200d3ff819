"""Sizes read from data (``x.item()``, boolean masks, ``nonzero``) under Dynamo's options that keep
them in the graph (``capture_scalar_outputs``, ``capture_dynamic_output_shape_ops``)."""

from __future__ import annotations

import torch
import torch._dynamo.config as dynamo_config

from neuron_compile import metrics


def _pad_with_ones(x: torch.Tensor, count: torch.Tensor) -> torch.Tensor:
    return torch.cat([x, x.new_ones(count.item())]) * 2


def _positive_part(x: torch.Tensor) -> torch.Tensor:
    return (x[x > 0] * 3).sum() + torch.nonzero(x).float().mean()


def _expand_rows(x: torch.Tensor, repeats: torch.Tensor) -> torch.Tensor:
    index = torch.arange(repeats.numel(), device=x.device).repeat_interleave(repeats, dim=0)
    return torch.index_select(x, 0, index) + 1


def test_a_size_read_with_item_compiles_once_for_every_value(fresh_compiler):
    # Failed with "u0 possible memo disaster": the lowering's own shape environment numbered its
    # data-dependent sizes from u0 again, clashing with the names Dynamo's graph binds.
    compiled = torch.compile(_pad_with_ones, backend="neuron")
    x = torch.randn(4)
    with dynamo_config.patch(capture_scalar_outputs=True):
        for count in (3, 5, 0, 7):
            got = compiled(x.to("neuron"), torch.tensor([count], device="neuron"))
            assert got.device.type == "neuron" and got.shape == (4 + count,)
            torch.testing.assert_close(got.cpu(), _pad_with_ones(x, torch.tensor([count])), rtol=0, atol=0)
    counters = metrics.counters()
    assert counters["graphs"] == 1 and counters["eager_fallbacks"] == 0, counters


def test_masks_and_data_dependent_outputs_compile(fresh_compiler):
    masked = torch.compile(_positive_part, backend="neuron")
    expand = torch.compile(_expand_rows, backend="neuron")
    x = torch.randn(32, 8, generator=torch.Generator().manual_seed(0))
    with dynamo_config.patch(capture_scalar_outputs=True, capture_dynamic_output_shape_ops=True):
        for seed in range(3):
            v = torch.randn(16, generator=torch.Generator().manual_seed(seed))
            torch.testing.assert_close(masked(v.to("neuron")).cpu(), _positive_part(v))
        for repeats in ([5, 10, 15], [1, 0, 2]):
            r = torch.tensor(repeats)
            torch.testing.assert_close(expand(x.to("neuron"), r.to("neuron")).cpu(), _expand_rows(x, r))
    assert metrics.counters()["eager_fallbacks"] == 0
