"""``scaled_dot_product_attention`` on jagged nested tensors (NJT) of neuron tensors.

For the usual multi-head layout, ``(B, H, j, D)`` with the ragged dimension third, torch's NJT
attention has no fused kernel off CUDA and takes its math path, which repacks the inputs as
*strided* nested tensors: those do not exist on neuron, and the refusal surfaced as an
unrelated "operator aten::stride does not exist". On neuron that path computes the same
thing, attention within each sequence, on dense per-sequence slices of the NJT's values, and
returns an NJT with the query's offsets, as the math path does. Gradients flow through the
slices to the inputs. Inputs the other paths take (the ``(B, j, H, D)`` layout's dense
shortcut, the CPU and CUDA) are left to torch.
"""

from __future__ import annotations

from typing import Any, Callable

import torch
import torch.nn.functional as F

_MODULE = "torch.nested._internal.ops"
_original: Callable[..., Any] | None = None


def _sequence_bounds(nested: Any) -> list[tuple[int, int]]:
    """(start, end) of each sequence in ``nested``'s values (lengths, when given, leave holes)."""
    offsets = nested.offsets().tolist()
    lengths = nested.lengths()
    if lengths is None:
        return list(zip(offsets[:-1], offsets[1:]))
    return [(start, start + length) for start, length in zip(offsets[:-1], lengths.tolist())]


def _per_sequence_attention(query: Any, key: Any, value: Any, dropout_p: float, scale: float | None,
                            enable_gqa: bool) -> Any:
    from torch.nested._internal.nested_tensor import nested_view_from_values_offsets_lengths

    # (B, H, j, D) -> values of shape (total, H, D); each sequence's slice -> (H, L, D).
    values = [t.transpose(1, 2).values() for t in (query, key, value)]
    bounds = [_sequence_bounds(t) for t in (query, key, value)]
    outputs = []
    for spans in zip(*bounds):  # one sequence: its (start, end) in the query's, key's and value's values
        q, k, v = (vals[start:end].transpose(0, 1) for vals, (start, end) in zip(values, spans))
        attended = F.scaled_dot_product_attention(q, k, v, dropout_p=dropout_p, scale=scale, enable_gqa=enable_gqa)
        outputs.append(attended.transpose(0, 1))
    return nested_view_from_values_offsets_lengths(
        torch.cat(outputs), query.offsets(), lengths=query.lengths(),
        min_seqlen=query._maybe_min_seqlen, max_seqlen=query._maybe_max_seqlen,
    ).transpose(1, 2)


def _takes_the_dense_shortcut(query: Any, key: Any, value: Any) -> bool:
    """The ``(B, j, H, D)`` layout, which torch's NJT attention runs on dense tensors."""
    return all(t.dim() > 3 for t in (query, key, value)) and getattr(query, "_ragged_idx", None) == 1


def _jagged_sdpa(query: Any, key: Any, value: Any, attn_mask: Any = None, dropout_p: float = 0.0,
                 is_causal: bool = False, scale: float | None = None, enable_gqa: bool = False) -> Any:
    assert _original is not None
    if query.device.type != "neuron" or _takes_the_dense_shortcut(query, key, value):  # torch's own paths
        return _original(query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa)
    return _jagged_sdpa_on_neuron(query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa)


# Run eagerly even inside a compiled function: Dynamo cannot trace torch's NJT math path either
# (it graph-breaks there on the CPU too), and the choice of path must be made when the
# attention runs, not baked into a trace that then runs torch's path eagerly on neuron.
@torch._disable_dynamo
def _jagged_sdpa_on_neuron(query: Any, key: Any, value: Any, attn_mask: Any, dropout_p: float,
                           is_causal: bool, scale: float | None, enable_gqa: bool) -> Any:
    assert _original is not None
    from torch.nested._internal import sdpa

    cast = sdpa._autocast(query, key, value, attn_mask)
    sdpa._validate_sdpa_input(*cast, dropout_p, is_causal, scale)
    if torch.compiler.is_compiling() or sdpa._select_sdp_backend(*cast, dropout_p, is_causal, enable_gqa) != \
            torch.nn.attention.SDPBackend.MATH:
        return _original(query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa)
    # torch's validation has refused masks on this path ("Masks are not yet supported!").
    return _per_sequence_attention(*cast[:3], dropout_p, scale, enable_gqa)


def _patch(module: Any) -> None:
    global _original
    current = getattr(module, "jagged_scaled_dot_product_attention", None)
    if current is None or current is _jagged_sdpa:
        return
    from torch.nested._internal import sdpa

    if not all(hasattr(sdpa, name) for name in ("_autocast", "_validate_sdpa_input", "_select_sdp_backend")):
        return  # a torch whose NJT attention is organised differently: left alone
    _original = current
    module.jagged_scaled_dot_product_attention = _jagged_sdpa


def install() -> None:
    """Routes neuron NJT attention's math path (applied when torch's NJT ops are imported)."""
    from neuron_runtime._post_import import install_finder, register_post_import_hook

    install_finder()
    register_post_import_hook(_MODULE, _patch)
