"""Collective signatures: what each rank is about to do, compared across ranks before any data moves.

Gloo aborts the whole process when ranks disagree on a message's size, and silently mixes data when
they disagree on a dtype of the same width. So before every collective the ranks exchange a small
fixed-size signature (sequence number, operation, dtype, shape, root, reduce op, all-to-all splits)
and all of them raise the same :class:`CollectiveMismatchError` when the signatures disagree.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from neuron_dist._errors import CollectiveMismatchError

__all__ = ["Signature", "check_signatures", "encode", "encode_fields", "signature_width"]

_MAX_DIMS = 6
_DTYPES: list[torch.dtype] = [
    torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int64, torch.int32,
    torch.int16, torch.int8, torch.uint8, torch.bool, torch.complex64, torch.complex128,
    torch.uint16, torch.uint32, torch.uint64, torch.float8_e4m3fn, torch.float8_e5m2,
]
_DTYPE_CODE = {dtype: code for code, dtype in enumerate(_DTYPES)}
_NONE = -1
# Operations whose tensors must have the same shape on every rank (the others need equal sizes
# only). Element-wise all_reduce, broadcast and reduce are not among them: gloo and NCCL move
# the flat data, so ranks may pass the same number of elements in different shapes.
_SAME_SHAPE_OPS = {"all_reduce_coalesced", "all_reduce_sparse"}
_SAME_SIZE_OPS = {"all_reduce", "broadcast", "reduce"}
_ROOTED_OPS = {"broadcast", "reduce", "gather", "scatter"}
_REDUCING_OPS = {"all_reduce", "all_reduce_coalesced", "all_reduce_sparse", "reduce", "reduce_scatter"}
# Operations where each rank sends its own amount (checked through the splits instead).
_SPLIT_OPS = {"all_to_all", "all_to_all_single"}


@dataclass(frozen=True)
class Signature:
    """What one rank passes to one collective.

    ``shape`` is the shape of the tensor every rank must agree on (the input, or for broadcast the
    buffer); ``numel`` its total size when several tensors are involved (coalesced calls).
    """

    op: str
    dtype: torch.dtype | None = None
    shape: tuple[int, ...] = ()
    numel: int | None = None
    root: int = _NONE
    reduce_op: int = _NONE
    in_splits: Sequence[int] | None = None
    out_splits: Sequence[int] | None = None

    def describe(self) -> str:
        """``float32[4, 8]``-style description, with root and reduce op when they matter."""
        if self.dtype is None:
            text = self.op
        else:
            dtype = str(self.dtype).removeprefix("torch.")
            text = f"{self.op} {dtype}[{', '.join(map(str, self.shape))}]"
            if self.numel is not None and self.numel != _prod(self.shape):
                text += f" ({self.numel} elements in all)"
        if self.root != _NONE:
            text += f" root={self.root}"
        if self.reduce_op != _NONE:
            text += f" op={_reduce_op_name(self.reduce_op)}"
        if self.in_splits is not None:
            text += f" input_splits={list(self.in_splits)} output_splits={list(self.out_splits or [])}"
        return text


def signature_width(world_size: int) -> int:
    """Number of int64 fields a signature occupies for a group of ``world_size`` ranks."""
    return 8 + _MAX_DIMS + 2 * world_size


def _op_names() -> list[str]:
    return [
        "all_reduce", "all_reduce_coalesced", "broadcast", "reduce", "all_gather", "all_gather_into_tensor",
        "all_gather_coalesced", "reduce_scatter", "reduce_scatter_tensor", "all_to_all",
        "all_to_all_single", "gather", "scatter", "barrier", "all_gather_into_tensor_coalesced",
        "reduce_scatter_tensor_coalesced", "all_reduce_sparse",
    ]


_OP_CODE = {name: code for code, name in enumerate(_op_names())}


def _prod(shape: Sequence[int]) -> int:
    out = 1
    for s in shape:
        out *= s
    return out


def _reduce_op_name(code: int) -> str:
    for op in torch.distributed.ReduceOp.RedOpType.__members__.values():
        if int(op) == code:
            return op.name
    return str(code)


def encode(signature: Signature, seq: int, world_size: int) -> torch.Tensor:
    """The int64 vector a rank contributes to the signature exchange."""
    fields = encode_fields(signature, world_size)
    fields[0] = seq
    return torch.tensor(fields, dtype=torch.int64, device="cpu")


def encode_fields(signature: Signature, world_size: int) -> list[int]:
    """The signature's :func:`signature_width` int64 fields, with 0 for the sequence number."""
    seq = 0
    shape = list(signature.shape)
    dims = shape[-_MAX_DIMS:] + [_NONE] * (_MAX_DIMS - min(len(shape), _MAX_DIMS))
    splits_in = list(signature.in_splits) if signature.in_splits is not None else [_NONE] * world_size
    splits_out = list(signature.out_splits) if signature.out_splits is not None else [_NONE] * world_size
    numel = signature.numel if signature.numel is not None else _prod(shape)
    fields = [
        seq,
        _OP_CODE[signature.op],
        _DTYPE_CODE.get(signature.dtype, 99) if signature.dtype is not None else _NONE,
        len(shape),
        numel,
        signature.root,
        signature.reduce_op,
        1 if signature.in_splits is not None else 0,
        *dims,
        *splits_in,
        *splits_out,
    ]
    return fields


def _decode(row: list[int], world_size: int) -> tuple[int, Signature]:
    seq, op_code, dtype_code, ndim, numel, root, reduce_op, has_splits = row[:8]
    dims = row[8 : 8 + _MAX_DIMS]
    splits = row[8 + _MAX_DIMS :]
    op = _op_names()[op_code]
    dtype = _DTYPES[dtype_code] if 0 <= dtype_code < len(_DTYPES) else None
    shape = tuple(dims[: min(ndim, _MAX_DIMS)])
    return seq, Signature(
        op=op,
        dtype=dtype,
        shape=shape,
        numel=numel,
        root=root,
        reduce_op=reduce_op,
        in_splits=splits[:world_size] if has_splits else None,
        out_splits=splits[world_size:] if has_splits else None,
    )


def check_signatures(gathered: torch.Tensor, world_size: int, where: str) -> None:
    """Raises :class:`CollectiveMismatchError` unless every rank's signature is compatible.

    ``gathered`` holds one encoded signature per rank (group rank order); ``where`` names the
    collective and group for the message. Every rank sees the same rows, so all of them raise.
    """
    rows = gathered.view(world_size, -1).tolist()
    if all(row == rows[0] for row in rows):
        return
    decoded = [_decode(row, world_size) for row in rows]
    seqs = {seq for seq, _ in decoded}
    ops = {sig.op for _, sig in decoded}
    problem = None
    if len(seqs) > 1 or len(ops) > 1:
        problem = "ranks are at different collectives (did a rank skip or add one?)"
    else:
        first = decoded[0][1]
        op = first.op
        keys = {(sig.dtype, sig.numel) for _, sig in decoded}
        if op in _SAME_SHAPE_OPS:
            keys = {(sig.dtype, sig.shape, sig.numel) for _, sig in decoded}
        elif op in _SAME_SIZE_OPS:
            keys = {(sig.dtype, _prod(sig.shape) if sig.numel is None else sig.numel) for _, sig in decoded}
        elif op in _SPLIT_OPS:
            keys = {(sig.dtype, sig.shape) for _, sig in decoded}
        if len(keys) > 1:
            problem = "tensors differ in shape or dtype across ranks"
        elif op in _ROOTED_OPS and len({sig.root for _, sig in decoded}) > 1:
            problem = "ranks passed different roots"
        elif op in _REDUCING_OPS and len({sig.reduce_op for _, sig in decoded}) > 1:
            problem = "ranks passed different reduce ops"
        elif first.in_splits is not None:
            for i, (_, sig_i) in enumerate(decoded):
                for j, (_, sig_j) in enumerate(decoded):
                    if sig_i.in_splits[j] != sig_j.out_splits[i]:
                        problem = (
                            f"rank {i} sends {sig_i.in_splits[j]} rows to rank {j}, "
                            f"which expects {sig_j.out_splits[i]} from it"
                        )
                        break
                if problem:
                    break
    if problem is None:  # rows differ only in fields that need not agree (e.g. shapes of all_gather inputs)
        return
    lines = "\n".join(f"  rank {rank}: collective #{seq} {sig.describe()}" for rank, (seq, sig) in enumerate(decoded))
    raise CollectiveMismatchError(f"neuron: {where}: {problem}:\n{lines}")
