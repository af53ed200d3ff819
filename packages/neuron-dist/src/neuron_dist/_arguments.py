"""Checks of one rank's own arguments to a collective, made when the call is issued.

A root outside the group, a list of the wrong length, or tensors of mixed dtypes or sizes in one
call cannot run on any rank. gloo refuses such calls before anything is sent, so the group stays
usable; these checks do the same for the neuron backend (before, such calls went out and failed
later as a transport error, or, for a list all-reduce of mixed tensors, ran). The messages follow
gloo's, which PyTorch's own tests match. Disagreements *between* ranks are the signature
exchange's job (:mod:`neuron_dist._signature`).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from neuron_dist._errors import CollectiveArgumentError

__all__ = [
    "check_allgather",
    "check_allgather_coalesced",
    "check_allgather_into_tensor",
    "check_allreduce",
    "check_alltoall",
    "check_alltoall_single",
    "check_broadcast",
    "check_gather",
    "check_reduce",
    "check_reduce_scatter",
    "check_reduce_scatter_tensor",
    "check_scatter",
]


def _fail(op: str, problem: str) -> CollectiveArgumentError:
    return CollectiveArgumentError(f"neuron: {op}: {problem}")


def _root(op: str, root: int, size: int) -> None:
    if not 0 <= root < size:
        raise _fail(op, f"invalid root rank: {root} (the group has ranks 0..{size - 1})")


def _non_empty(op: str, tensors: Sequence[torch.Tensor], what: str = "tensor list") -> None:
    if len(tensors) == 0:
        raise _fail(op, f"requires non-empty {what}")


def _single(op: str, tensors: Sequence[object], what: str) -> None:
    if len(tensors) != 1:
        raise _fail(op, f"requires a single-element {what} (got {len(tensors)})")


def _like(op: str, expected: torch.Tensor, tensors: Sequence[torch.Tensor], offset: int = 0) -> None:
    """Every tensor has ``expected``'s dtype and size."""
    for index, tensor in enumerate(tensors, start=offset):
        if tensor.dtype != expected.dtype:
            raise _fail(op, f"invalid tensor type at index {index} (expected {expected.dtype}, got {tensor.dtype})")
        if tensor.shape != expected.shape:
            raise _fail(op, f"invalid tensor size at index {index} "
                            f"(expected {tuple(expected.shape)}, got {tuple(tensor.shape)})")


def _same_dtype(op: str, tensors: Sequence[torch.Tensor]) -> None:
    if len({t.dtype for t in tensors}) > 1:
        raise _fail(op, f"tensors must all have the same type (got {sorted({str(t.dtype) for t in tensors})})")


def _list_of_size(op: str, tensors: Sequence[torch.Tensor], size: int, what: str) -> None:
    if len(tensors) != size:
        raise _fail(op, f"Incorrect {what} list size {len(tensors)}. {what.capitalize()} list size should be "
                        f"{size}, same as size of the process group.")


def check_broadcast(tensors: Sequence[torch.Tensor], root: int, root_tensor: int, size: int) -> None:
    """``broadcast``: a root in the group, an existing root tensor, tensors alike."""
    _root("broadcast", root, size)
    if not 0 <= root_tensor < len(tensors):
        raise _fail("broadcast", f"invalid root tensor: {root_tensor} (the list has {len(tensors)})")
    _like("broadcast", tensors[0], tensors[1:], offset=1)


def check_allreduce(op: str, tensors: Sequence[torch.Tensor]) -> None:
    """``all_reduce``: tensors alike; ``all_reduce_coalesced``: one dtype."""
    _non_empty(op, tensors)
    if op == "all_reduce":
        _like(op, tensors[0], tensors[1:], offset=1)
        return
    for index, tensor in enumerate(tensors[1:], start=1):
        if tensor.layout != tensors[0].layout:
            raise _fail(op, f"invalid tensor layout at index {index} (expected {tensors[0].layout}, got {tensor.layout})")
    if tensors[0].layout != torch.strided:
        raise _fail(op, f"unsupported layout {tensors[0].layout}: the neuron backend reduces dense tensors")
    _same_dtype(op, tensors)


def check_sparse_allreduce(tensors: Sequence[torch.Tensor], is_sum: bool) -> None:
    """``all_reduce`` of sparse COO tensors: on the CPU (the neuron device holds dense tensors
    only), and a sum (gloo's sparse all-reduce sums)."""
    for tensor in tensors:
        if tensor.device.type != "cpu":
            raise _fail("all_reduce", f"got a sparse tensor on '{tensor.device}': the neuron device holds dense "
                                      "tensors only. All-reduce sparse tensors on the CPU, or call .to_dense() first")
    if not is_sum:
        raise _fail("all_reduce", "unsupported reduction operation (allreduce of sparse tensors only works with "
                                  "ReduceOp.SUM)")


def check_reduce(tensors: Sequence[torch.Tensor], root: int, root_tensor: int, size: int) -> None:
    """``reduce``: one tensor, a root in the group."""
    _root("reduce", root, size)
    _single("reduce", tensors, "tensor list")
    if root_tensor != 0:
        raise _fail("reduce", f"invalid root tensor: {root_tensor} (the list has 1)")


def check_allgather(output_lists: Sequence[Sequence[torch.Tensor]], inputs: Sequence[torch.Tensor],
                    size: int) -> None:
    """List ``all_gather``: per input, a list of every rank's inputs (``size`` x inputs), like them."""
    _non_empty("all_gather", inputs, "input tensor list")
    if len(output_lists) != len(inputs):
        raise _fail("all_gather", "requires input/output tensor lists to have the same length "
                                  f"(got {len(inputs)} inputs and {len(output_lists)} output lists)")
    _like("all_gather", inputs[0], inputs[1:], offset=1)
    expected = size * len(inputs)
    for position, outputs in enumerate(output_lists):
        if len(outputs) != expected:
            raise _fail("all_gather", f"invalid output tensor list at index {position} "
                                      f"(expected length {expected}, got {len(outputs)})")
        _like("all_gather", inputs[0], outputs)


def check_allgather_coalesced(output_lists: Sequence[Sequence[torch.Tensor]], inputs: Sequence[torch.Tensor],
                              size: int) -> None:
    """``all_gather_coalesced``: per rank, a list of outputs like the inputs."""
    _non_empty("all_gather_coalesced", inputs, "input tensor list")
    if len(output_lists) != size:
        raise _fail("all_gather_coalesced", f"output lists should be equal to world size "
                                            f"(got {len(output_lists)}, world size {size})")
    for outputs in output_lists:
        if len(outputs) != len(inputs):
            raise _fail("all_gather_coalesced", f"invalid output size: (expected length {len(inputs)}, "
                                                f"got {len(outputs)})")
        for index, (output, input) in enumerate(zip(outputs, inputs)):
            if output.shape != input.shape:
                raise _fail("all_gather_coalesced", f"invalid size of output tensor at index {index} "
                                                    f"(expected {tuple(input.shape)}, got {tuple(output.shape)})")
            _like("all_gather_coalesced", input, [output], offset=index)


def _flat_pairs(op: str, outputs: Sequence[torch.Tensor], inputs: Sequence[torch.Tensor], size: int,
                whole: str) -> None:
    """Output/input pairs of one dtype, the ``whole`` side ("output" or "input") ``size`` times the other."""
    _non_empty(op, inputs, "input tensor list")
    if len(outputs) != len(inputs):
        raise _fail(op, f"requires as many outputs as inputs (got {len(outputs)} and {len(inputs)})")
    part = "input" if whole == "output" else "output"
    for output, input in zip(outputs, inputs):
        if output.dtype != input.dtype:
            raise _fail(op, f"output tensor must have the same type as input tensor "
                            f"(got {output.dtype} and {input.dtype})")
        big, small = (output, input) if whole == "output" else (input, output)
        if big.numel() != small.numel() * size:
            raise _fail(op, f"{whole} tensor size must be equal to world_size times {part} tensor size "
                            f"({whole} has {big.numel()} elements, {part} {small.numel()}, world size {size})")


def check_allgather_into_tensor(op: str, outputs: Sequence[torch.Tensor], inputs: Sequence[torch.Tensor],
                                size: int) -> None:
    """``all_gather_into_tensor``: each output holds ``size`` inputs, in the input's dtype."""
    _flat_pairs(op, outputs, inputs, size, whole="output")


def check_reduce_scatter(outputs: Sequence[torch.Tensor], input_lists: Sequence[Sequence[torch.Tensor]],
                         rank: int, size: int) -> None:
    """List ``reduce_scatter``: one output, one list of ``size`` inputs of its dtype, this rank's
    input of its size (the others may differ: input i is rank i's output)."""
    _single("reduce_scatter", outputs, "output tensor list")
    _single("reduce_scatter", input_lists, "input list")
    _list_of_size("reduce_scatter", input_lists[0], size, "input")
    _same_dtype("reduce_scatter", [outputs[0], *input_lists[0]])
    _like("reduce_scatter", outputs[0], [input_lists[0][rank]], offset=rank)


def check_reduce_scatter_tensor(op: str, outputs: Sequence[torch.Tensor], inputs: Sequence[torch.Tensor],
                                size: int) -> None:
    """``reduce_scatter_tensor``: each input holds ``size`` outputs, in the output's dtype."""
    _flat_pairs(op, outputs, inputs, size, whole="input")


def _rooted(op: str, root: int, rank: int, size: int, singles: Sequence[torch.Tensor], single_name: str,
            lists: Sequence[Sequence[torch.Tensor]], list_name: str) -> None:
    """One ``single_name`` tensor on every rank; the root alone passes one list of ``size``
    ``list_name`` tensors like it (``gather``: outputs, ``scatter``: inputs)."""
    _root(op, root, size)
    _single(op, singles, f"{single_name} tensor list")
    if rank == root:
        if len(lists) != 1:
            raise _fail(op, f"requires a single-element {list_name} list containing a list with {size} tensors")
        _list_of_size(op, lists[0], size, list_name)
        _like(op, singles[0], lists[0])
    elif len(lists) > 0:
        raise _fail(op, f"requires empty {list_name} on non-root")


def check_gather(output_lists: Sequence[Sequence[torch.Tensor]], inputs: Sequence[torch.Tensor],
                 root: int, rank: int, size: int) -> None:
    """``gather``: one input; the root alone passes one list of ``size`` outputs like it."""
    _rooted("gather", root, rank, size, inputs, "input", output_lists, "output")


def check_scatter(outputs: Sequence[torch.Tensor], input_lists: Sequence[Sequence[torch.Tensor]],
                  root: int, rank: int, size: int) -> None:
    """``scatter``: one output; the root alone passes one list of ``size`` inputs like it."""
    _rooted("scatter", root, rank, size, outputs, "output", input_lists, "input")


def check_alltoall(outputs: Sequence[torch.Tensor], inputs: Sequence[torch.Tensor], size: int) -> None:
    """List ``all_to_all``: ``size`` inputs and outputs of one dtype (sizes may differ)."""
    _list_of_size("all_to_all", inputs, size, "input")
    _list_of_size("all_to_all", outputs, size, "output")
    _same_dtype("all_to_all", [*inputs, *outputs])


def check_alltoall_single(output: torch.Tensor, input: torch.Tensor, output_splits: Sequence[int],
                          input_splits: Sequence[int], size: int) -> None:
    """``all_to_all_single``: one dtype; split sizes, when given, one per rank and summing to the rows."""
    if output.dtype != input.dtype:
        raise _fail("all_to_all_single", f"output tensor must have the same type as input tensor "
                                         f"(got {output.dtype} and {input.dtype})")
    for name, tensor, splits in (("input", input, input_splits), ("output", output, output_splits)):
        rows = tensor.shape[0] if tensor.dim() > 0 else 1
        if len(splits) == 0:
            if rows % size:
                raise _fail("all_to_all_single", f"{name} tensor's first dimension ({rows}) must be divisible "
                                                 f"by the group size ({size}) when no split sizes are given")
            continue
        if len(splits) != size:
            raise _fail("all_to_all_single", f"{name} split sizes must have one entry per rank "
                                             f"(got {len(splits)}, group size {size})")
        if any(s < 0 for s in splits) or sum(splits) != rows:
            raise _fail("all_to_all_single", f"{name} split sizes {list(splits)} must be non-negative and sum "
                                             f"to the {name} tensor's first dimension ({rows})")
