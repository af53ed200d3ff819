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


def plan_reduction(dtype: torch.dtype, op: dist.ReduceOp | _RedOpType, world_size: int, where: str) -> Reduction:
    """The :class:`Reduction` for reducing ``dtype`` tensors with ``op`` over ``world_size`` ranks."""
    op_type = reduce_op_type(op)
    if op_type not in _SUPPORTED_OPS:
        raise ValueError(
            f"neuron: {where}: reduce op {op_type.name} is not supported by the neuron backend "
            f"(supported: SUM, AVG, PRODUCT, MIN, MAX, BAND, BOR, BXOR)"
        )
    wire = _STAGED.get(dtype)
    integral = not (dtype.is_floating_point or dtype.is_complex)
    if op_type == _RedOpType.AVG and integral:
        return Reduction(_RedOpType.SUM, wire, world_size)
    return Reduction(op_type, wire, 0)
