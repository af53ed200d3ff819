"""How a reduction runs on gloo: the dtype on the wire, gloo's reduce op, and the fix-up after.

Gloo reduces float32/64, float16, bfloat16, int8/32/64, uint8 and bool with SUM, PRODUCT, MIN, MAX
(and AVG on floating types). What it lacks is done here: integer AVG is a SUM followed by a
truncating division (NCCL's integer semantics), and dtypes gloo cannot reduce (int16, the wider
unsigned types, float8) are staged through a dtype it can, then copied back.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist

from neuron_dist._errors import CollectiveArgumentError

__all__ = ["Reduction", "plan_reduction", "reduce_op_type"]

_RedOpType = dist.ReduceOp.RedOpType
_STAGED: dict[torch.dtype, torch.dtype] = {
    torch.int16: torch.int32,
    torch.uint16: torch.int32,
    torch.uint32: torch.int64,
    torch.uint64: torch.int64,
    torch.float8_e4m3fn: torch.float32,
    torch.float8_e5m2: torch.float32,
}
# elementwise combination of two ranks' values, per gloo reduce op (AVG: a SUM divided afterwards)
_COMBINE = {
    _RedOpType.SUM: torch.add, _RedOpType.AVG: torch.add, _RedOpType.PRODUCT: torch.mul,
    _RedOpType.MIN: torch.minimum, _RedOpType.MAX: torch.maximum, _RedOpType.BAND: torch.bitwise_and,
    _RedOpType.BOR: torch.bitwise_or, _RedOpType.BXOR: torch.bitwise_xor,
}
_COMPLEX_OPS = {_RedOpType.SUM, _RedOpType.AVG}
_SUPPORTED_OPS = {_RedOpType.SUM, _RedOpType.AVG, _RedOpType.PRODUCT, _RedOpType.MIN, _RedOpType.MAX,
                  _RedOpType.BAND, _RedOpType.BOR, _RedOpType.BXOR}


def reduce_op_type(op: dist.ReduceOp | _RedOpType) -> _RedOpType:
    """The :class:`ReduceOp.RedOpType` of a reduce op given either way."""
    return op.op if isinstance(op, dist.ReduceOp) else op


@dataclass(frozen=True)
class Reduction:
    """One reduction as gloo runs it."""

    op: _RedOpType
    wire_dtype: torch.dtype | None  # None: gloo reduces the caller's dtype directly
    divisor: int  # > 0: divide the gathered SUM by it afterwards (integer AVG)

    def to_wire(self, view: torch.Tensor) -> torch.Tensor:
        """The tensor gloo reduces in place: ``view`` itself or a staged copy."""
        return view if self.wire_dtype is None else view.to(self.wire_dtype)

    def from_wire(self, wire: torch.Tensor, view: torch.Tensor, *, divide: bool = True) -> None:
        """Finishes the reduction into ``view`` once gloo completed on ``wire``."""
        if self.divisor and divide:
            wire.div_(self.divisor, rounding_mode="trunc")
        if wire is not view:
            view.copy_(wire)

    def reduce_rows(self, rows: list[torch.Tensor], out: torch.Tensor) -> None:
        """Reduces every rank's copy (``rows``, in rank order, each shaped like ``out``) into ``out``.

        The local counterpart of gloo's reduction, for data that arrived by all-gather: the same
        wire dtype, op, AVG division and integer fix-up. Every rank combines the rows in the same
        order, so all ranks get bitwise-identical results. With 2 ranks it is bitwise gloo's result
        (one combination, commutative); with more, floating SUM/AVG/PRODUCT may differ from gloo's
        ring order in the last bits.
        """
        if self.wire_dtype is not None:
            rows = [row.to(self.wire_dtype) for row in rows]
            acc = torch.empty_like(rows[0])
        else:
            acc = out
        combine = _COMBINE[self.op]
        combine(rows[0], rows[1], out=acc)
        for row in rows[2:]:
            combine(acc, row, out=acc)
        if self.op == _RedOpType.AVG:
            acc.div_(len(rows))
        if self.divisor:
            acc.div_(self.divisor, rounding_mode="trunc")
        if acc is not out:
            out.copy_(acc)


def plan_reduction(dtype: torch.dtype, op: dist.ReduceOp | _RedOpType, world_size: int, where: str) -> Reduction:
    """The :class:`Reduction` for reducing ``dtype`` tensors with ``op`` over ``world_size`` ranks."""
    op_type = reduce_op_type(op)
    if op_type not in _SUPPORTED_OPS:
        raise CollectiveArgumentError(
            f"neuron: {where}: reduce op {op_type.name} is not supported by the neuron backend "
            f"(supported: SUM, AVG, PRODUCT, MIN, MAX, BAND, BOR, BXOR)"
        )
    if dtype.is_complex and op_type not in _COMPLEX_OPS:
        raise CollectiveArgumentError(
            f"neuron: {where}: reduce op {op_type.name} is not supported on complex tensors "
            f"({dtype}), as with gloo and NCCL: use SUM or AVG"
        )
    wire = _STAGED.get(dtype)
    integral = not (dtype.is_floating_point or dtype.is_complex)
    if op_type == _RedOpType.AVG and integral:
        return Reduction(_RedOpType.SUM, wire, world_size)
    return Reduction(op_type, wire, 0)
