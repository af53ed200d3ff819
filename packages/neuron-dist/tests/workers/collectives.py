"""Every collective of the "neuron" backend, checked against values computed locally from each
rank's known input; subgroups, DeviceMesh sub-meshes, functional collectives, coalescing, async
handles, object collectives, and the clear errors for mismatched calls and wrong devices."""

from __future__ import annotations

import datetime
import os
from functools import reduce as fold

import torch
import torch.distributed as dist
import torch.distributed._functional_collectives as funcol
from torch.distributed.device_mesh import init_device_mesh

import neuron_dist
from _cases import Cases, destroy_when_every_rank_is_done

cases = Cases()
dist.init_process_group("neuron")
RANK, WORLD = dist.get_rank(), dist.get_world_size()
DEVICE = torch.device("neuron", torch.neuron.current_device())
R = dist.ReduceOp


def _value(rank: int, dtype: torch.dtype, n: int = 6) -> torch.Tensor:
    """Rank ``rank``'s input, on the CPU (the reference) -- small values so products stay exact."""
    return (torch.arange(n) % 3 + rank + 1).to(dtype)


def _expect(actual: torch.Tensor, expected: torch.Tensor, what: str) -> None:
    assert actual.device == DEVICE, f"{what}: result on {actual.device}, expected {DEVICE}"
    assert actual.dtype == expected.dtype, f"{what}: dtype {actual.dtype} != {expected.dtype}"
    if not torch.equal(actual.cpu(), expected):
        raise AssertionError(f"{what}: got {actual.cpu().tolist()}, expected {expected.tolist()}")


@cases.case
def binds_local_core() -> int:
    assert torch.neuron.current_device() == int(os.environ["LOCAL_RANK"])
    assert torch.empty(1, device="neuron").device == DEVICE
    return torch.neuron.current_device()


_REDUCERS = {
    R.SUM: lambda xs: fold(torch.add, xs),
    R.PRODUCT: lambda xs: fold(torch.mul, xs),
    R.MAX: lambda xs: fold(torch.maximum, xs),
    R.MIN: lambda xs: fold(torch.minimum, xs),
}


def _reference(op: R.RedOpType, dtype: torch.dtype) -> torch.Tensor:
    inputs = [_value(r, dtype) for r in range(WORLD)]
    if op == R.AVG:
        total = fold(torch.add, [x.to(torch.int32) for x in inputs])
        avg = total / WORLD
        return (avg.trunc() if not dtype.is_floating_point else avg).to(dtype)
    return _REDUCERS[op](inputs)


def _all_reduce_case(dtype: torch.dtype):
    def case() -> None:
        for op in (R.SUM, R.AVG, R.MAX, R.MIN, R.PRODUCT):
            tensor = _value(RANK, dtype).to(DEVICE)
            ptr = tensor.data_ptr()
            dist.all_reduce(tensor, op=op)
            assert tensor.data_ptr() == ptr, "all_reduce must work in place on device memory"
            _expect(tensor, _reference(op, dtype), f"all_reduce {op} {dtype}")

    case.__name__ = f"all_reduce_{str(dtype).removeprefix('torch.')}"
    return case


for _dtype in (torch.float32, torch.bfloat16, torch.float16, torch.int64, torch.int32, torch.uint8, torch.int16):
    cases.case(_all_reduce_case(_dtype))


@cases.case
def broadcast_and_reduce() -> None:
    for dtype in (torch.float32, torch.bfloat16, torch.int64):
        root = WORLD - 1
        tensor = _value(RANK, dtype).to(DEVICE)
        dist.broadcast(tensor, src=root)
        _expect(tensor, _value(root, dtype), f"broadcast {dtype}")
        tensor = _value(RANK, dtype).to(DEVICE)
        dist.reduce(tensor, dst=0, op=R.SUM)
        if RANK == 0:
            _expect(tensor, _reference(R.SUM, dtype), f"reduce {dtype}")
    tensor = _value(RANK, torch.int64).to(DEVICE)
    dist.reduce(tensor, dst=0, op=R.AVG)
    if RANK == 0:
        _expect(tensor, _reference(R.AVG, torch.int64), "reduce AVG int64")


@cases.case
def all_gather_list_and_into_tensor() -> None:
    for dtype in (torch.float32, torch.bfloat16, torch.int64, torch.int16):
        expected = [_value(r, dtype) for r in range(WORLD)]
        outputs = [torch.empty(6, dtype=dtype, device=DEVICE) for _ in range(WORLD)]
        dist.all_gather(outputs, _value(RANK, dtype).to(DEVICE))
        for r in range(WORLD):
            _expect(outputs[r], expected[r], f"all_gather list {dtype} slot {r}")
        flat = torch.empty(6 * WORLD, dtype=dtype, device=DEVICE)
        dist.all_gather_into_tensor(flat, _value(RANK, dtype).to(DEVICE))
        _expect(flat, torch.cat(expected), f"all_gather_into_tensor {dtype}")


@cases.case
def reduce_scatter_list_and_tensor() -> None:
    for dtype, op in ((torch.float32, R.SUM), (torch.bfloat16, R.AVG), (torch.int64, R.SUM), (torch.int32, R.MAX)):
        full = [torch.cat([_value(r, dtype, 2) * (k + 1) for k in range(WORLD)]) for r in range(WORLD)]
        chunks = [list(x.chunk(WORLD)) for x in full]
        if op == R.AVG:
            expected = (sum(c[RANK].float() for c in chunks) / WORLD).to(dtype)
        else:
            expected = (_REDUCERS[op])([c[RANK] for c in chunks])
        out = torch.empty(2, dtype=dtype, device=DEVICE)
        dist.reduce_scatter_tensor(out, full[RANK].to(DEVICE), op=op)
        _expect(out, expected, f"reduce_scatter_tensor {dtype} {op}")
        out = torch.empty(2, dtype=dtype, device=DEVICE)
        dist.reduce_scatter(out, [c.to(DEVICE) for c in chunks[RANK]], op=op)
        _expect(out, expected, f"reduce_scatter list {dtype} {op}")


@cases.case
def all_to_all_single_equal_and_uneven() -> None:
    rows = torch.arange(WORLD * 2).reshape(WORLD, 2) + 100 * RANK
    out = torch.empty(WORLD, 2, dtype=torch.int64, device=DEVICE)
    dist.all_to_all_single(out, rows.to(DEVICE))
    expected = torch.stack([torch.arange(WORLD * 2).reshape(WORLD, 2)[RANK] + 100 * r for r in range(WORLD)])
    _expect(out, expected, "all_to_all_single equal splits")
    # uneven: rank r sends (j + 1) rows to rank j, each row filled with 10 * r + j
    in_splits = [j + 1 for j in range(WORLD)]
    out_splits = [RANK + 1] * WORLD
    send = torch.cat([torch.full((j + 1, 3), 10.0 * RANK + j) for j in range(WORLD)]).to(torch.bfloat16)
    recv = torch.empty(sum(out_splits), 3, dtype=torch.bfloat16, device=DEVICE)
    dist.all_to_all_single(recv, send.to(DEVICE), out_splits, in_splits)
    expected = torch.cat([torch.full((RANK + 1, 3), 10.0 * r + RANK) for r in range(WORLD)]).to(torch.bfloat16)
    _expect(recv, expected, "all_to_all_single uneven splits")
    # ranks sending different totals (legal: rank r sends r + 1 rows to every rank)
    send = torch.full((WORLD * (RANK + 1), 2), float(RANK)).to(DEVICE)
    recv = torch.empty(sum(r + 1 for r in range(WORLD)), 2, device=DEVICE)
    dist.all_to_all_single(recv, send, [r + 1 for r in range(WORLD)], [RANK + 1] * WORLD)
    expected = torch.cat([torch.full((r + 1, 2), float(r)) for r in range(WORLD)])
    _expect(recv, expected, "all_to_all_single with different totals per rank")


@cases.case
def all_to_all_list() -> None:
    send = [torch.full((2,), 10 * RANK + j, dtype=torch.int32, device=DEVICE) for j in range(WORLD)]
    recv = [torch.empty(2, dtype=torch.int32, device=DEVICE) for _ in range(WORLD)]
    dist.all_to_all(recv, send)
    for r in range(WORLD):
        _expect(recv[r], torch.full((2,), 10 * r + RANK, dtype=torch.int32), f"all_to_all slot {r}")
    # tensors of a different size from each rank
    send = [torch.full((RANK + 1,), float(RANK), device=DEVICE) for _ in range(WORLD)]
    recv = [torch.empty(r + 1, device=DEVICE) for r in range(WORLD)]
    dist.all_to_all(recv, send)
    for r in range(WORLD):
        _expect(recv[r], torch.full((r + 1,), float(r)), f"all_to_all uneven slot {r}")


@cases.case
def gather_and_scatter() -> None:
    root = WORLD - 1
    gathered = [torch.empty(6, device=DEVICE) for _ in range(WORLD)] if RANK == root else None
    dist.gather(_value(RANK, torch.float32).to(DEVICE), gathered, dst=root)
    if RANK == root:
        for r in range(WORLD):
            _expect(gathered[r], _value(r, torch.float32), f"gather slot {r}")
    out = torch.empty(6, dtype=torch.bfloat16, device=DEVICE)
    scatter_list = [_value(r, torch.bfloat16).to(DEVICE) * 2 for r in range(WORLD)] if RANK == 0 else None
    dist.scatter(out, scatter_list, src=0)
    _expect(out, _value(RANK, torch.bfloat16) * 2, "scatter")


@cases.case
def send_recv_ring_and_batch_p2p() -> None:
    nxt, prv = (RANK + 1) % WORLD, (RANK - 1) % WORLD
    got = torch.empty(6, device=DEVICE)
    if RANK % 2 == 0:
        dist.send(_value(RANK, torch.float32).to(DEVICE), dst=nxt)
        dist.recv(got, src=prv)
    else:
        dist.recv(got, src=prv)
        dist.send(_value(RANK, torch.float32).to(DEVICE), dst=nxt)
    _expect(got, _value(prv, torch.float32), "send/recv ring")
    got = torch.empty(6, dtype=torch.int64, device=DEVICE)
    ops = [dist.P2POp(dist.isend, _value(RANK, torch.int64).to(DEVICE), nxt),
           dist.P2POp(dist.irecv, got, prv)]
    for work in dist.batch_isend_irecv(ops):
        work.wait()
    _expect(got, _value(prv, torch.int64), "batch_isend_irecv")


@cases.case
def async_handles_and_futures() -> None:
    tensors = [_value(RANK, torch.float32).to(DEVICE) for _ in range(3)]
    works = [dist.all_reduce(t, async_op=True) for t in tensors]
    for work in works:
        work.wait()
        assert work.is_completed()
    for t in tensors:
        _expect(t, _reference(R.SUM, torch.float32), "async all_reduce")
    tensor = _value(RANK, torch.int64).to(DEVICE)
    fut = dist.all_reduce(tensor, op=R.AVG, async_op=True).get_future()
    doubled = fut.then(lambda f: f.value()[0] * 2).wait()
    _expect(doubled, _reference(R.AVG, torch.int64) * 2, "future chained on int AVG")
    out = torch.empty(6 * WORLD, device=DEVICE)
    work = dist.all_gather_into_tensor(out, _value(RANK, torch.float32).to(DEVICE), async_op=True)
    work.wait()
    _expect(out, torch.cat([_value(r, torch.float32) for r in range(WORLD)]), "async all_gather_into_tensor")


@cases.case
def work_queries_and_any_source_recv() -> int:
    """The handles torch returns answer every query from the collective's own work, a receive
    from any source reports its sender, and the group's monitored_barrier reaches the backend
    (``dist.monitored_barrier`` itself accepts only gloo groups)."""
    tensor = _value(RANK, torch.float32).to(DEVICE)
    work = dist.all_reduce(tensor, async_op=True)
    work.wait()
    assert work.is_completed() and work.is_success() and work.exception() is None
    _expect(tensor, _reference(R.SUM, torch.float32), "all_reduce before work queries")
    dist.group.WORLD.monitored_barrier(datetime.timedelta(seconds=60))
    if RANK == 1:
        dist.send(torch.full((3,), 7.0, device=DEVICE), dst=0)
    if RANK == 0:
        got = torch.empty(3, device=DEVICE)
        sender = dist.recv(got)  # no src: recv_anysource, whose work reports the source rank
        assert sender == 1, sender
        _expect(got, torch.full((3,), 7.0), "recv from any source")
    dist.barrier()
    return RANK


@cases.case
def coalesced_calls() -> None:
    a, b = _value(RANK, torch.float32).to(DEVICE), _value(RANK, torch.float32, 4).to(DEVICE)
    with dist._coalescing_manager(async_ops=True) as cm:
        dist.all_reduce(a)
        dist.all_reduce(b)
    cm.wait()
    _expect(a, _reference(R.SUM, torch.float32), "coalesced all_reduce a")
    _expect(b, _REDUCERS[R.SUM]([_value(r, torch.float32, 4) for r in range(WORLD)]), "coalesced all_reduce b")
    outs = [torch.empty(6 * WORLD, device=DEVICE), torch.empty(2 * WORLD, device=DEVICE)]
    ins = [_value(RANK, torch.float32).to(DEVICE), _value(RANK, torch.float32, 2).to(DEVICE)]
    with dist._coalescing_manager(async_ops=True) as cm:
        for o, i in zip(outs, ins):
            dist.all_gather_into_tensor(o, i)
    cm.wait()
    _expect(outs[0], torch.cat([_value(r, torch.float32) for r in range(WORLD)]), "coalesced all_gather 0")
    _expect(outs[1], torch.cat([_value(r, torch.float32, 2) for r in range(WORLD)]), "coalesced all_gather 1")
    full = torch.arange(4.0 * WORLD, device=DEVICE) + RANK
    out = torch.empty(4, device=DEVICE)
    with dist._coalescing_manager(async_ops=True) as cm:
        dist.reduce_scatter_tensor(out, full)
    cm.wait()
    expected = sum(torch.arange(4.0 * WORLD) + r for r in range(WORLD)).chunk(WORLD)[RANK]
    _expect(out, expected, "coalesced reduce_scatter_tensor")


@cases.case
def object_collectives() -> None:
    objs = [None] * WORLD
    dist.all_gather_object(objs, {"rank": RANK, "text": "x" * RANK})
    assert objs == [{"rank": r, "text": "x" * r} for r in range(WORLD)], objs
    box = [{"from": "root"} if RANK == 0 else None]
    dist.broadcast_object_list(box, src=0)
    assert box == [{"from": "root"}], box
    gathered = [None] * WORLD if RANK == 0 else None
    dist.gather_object(RANK * 3, gathered, dst=0)
    if RANK == 0:
        assert gathered == [r * 3 for r in range(WORLD)], gathered
    out = [None]
    dist.scatter_object_list(out, [f"item{r}" for r in range(WORLD)] if RANK == 0 else None, src=0)
    assert out == [f"item{RANK}"], out
    dist.barrier()


@cases.case
def functional_collectives() -> None:
    group = dist.group.WORLD
    x = _value(RANK, torch.float32).to(DEVICE)
    _expect(funcol.all_reduce(x, "sum", group), _reference(R.SUM, torch.float32), "funcol.all_reduce")
    _expect(funcol.all_reduce(x, "avg", group), _reference(R.AVG, torch.float32), "funcol.all_reduce avg")
    _expect(funcol.all_gather_tensor(x, 0, group), torch.cat([_value(r, torch.float32) for r in range(WORLD)]),
            "funcol.all_gather_tensor")
    full = (torch.arange(2.0 * WORLD) + RANK).to(DEVICE)
    expected = sum(torch.arange(2.0 * WORLD) + r for r in range(WORLD)).chunk(WORLD)[RANK]
    _expect(funcol.reduce_scatter_tensor(full, "sum", 0, group), expected, "funcol.reduce_scatter_tensor")
    rows = (torch.arange(WORLD * 2.0).reshape(WORLD, 2) + 100 * RANK).to(DEVICE)
    got = funcol.all_to_all_single(rows, None, None, group)
    expected = torch.stack([torch.arange(WORLD * 2.0).reshape(WORLD, 2)[RANK] + 100 * r for r in range(WORLD)])
    _expect(got, expected, "funcol.all_to_all_single")


@cases.case
def subgroups_from_new_group() -> None:
    evens, odds = list(range(0, WORLD, 2)), list(range(1, WORLD, 2))
    groups = [dist.new_group(evens), dist.new_group(odds)]
    mine = groups[RANK % 2]
    members = evens if RANK % 2 == 0 else odds
    assert dist.get_backend(mine) == "neuron"
    tensor = _value(RANK, torch.float32).to(DEVICE)
    dist.all_reduce(tensor, group=mine)
    _expect(tensor, _REDUCERS[R.SUM]([_value(r, torch.float32) for r in members]), "subgroup all_reduce")
    out = torch.empty(6 * len(members), dtype=torch.int64, device=DEVICE)
    dist.all_gather_into_tensor(out, _value(RANK, torch.int64).to(DEVICE), group=mine)
    _expect(out, torch.cat([_value(r, torch.int64) for r in members]), "subgroup all_gather")
    box = [RANK]
    dist.broadcast_object_list(box, src=members[-1], group=mine)
    assert box == [members[-1]], box


@cases.case
def device_mesh_submeshes() -> None:
    if WORLD % 2:
        return None
    mesh = init_device_mesh("neuron", (WORLD // 2, 2), mesh_dim_names=("dp", "tp"))
    assert mesh.device_type == "neuron"
    for dim in ("dp", "tp"):
        sub = mesh[dim]
        group = sub.get_group()
        members = dist.get_process_group_ranks(group)
        tensor = _value(RANK, torch.float32).to(DEVICE)
        dist.all_reduce(tensor, group=group)
        _expect(tensor, _REDUCERS[R.SUM]([_value(r, torch.float32) for r in members]), f"mesh[{dim!r}] all_reduce")
        got = funcol.all_gather_tensor(_value(RANK, torch.float32).to(DEVICE), 0, (mesh, ("dp", "tp").index(dim)))
        _expect(got, torch.cat([_value(r, torch.float32) for r in members]), f"funcol on mesh dim {dim}")
    return mesh.mesh.tolist()


@cases.case
def mismatched_shapes_raise_on_every_rank() -> str:
    tensor = torch.ones(4 if RANK == 0 else 8, device=DEVICE)
    try:
        dist.all_reduce(tensor)
    except neuron_dist.CollectiveMismatchError as error:
        text = str(error)
        assert "all_reduce" in text and "float32[4]" in text and "float32[8]" in text, text
        assert "collective #" in text, text
    else:
        raise AssertionError("no error for mismatched shapes")
    tensor = torch.ones(4, device=DEVICE)
    dist.all_reduce(tensor)  # the group is still in step
    _expect(tensor, torch.full((4,), float(WORLD)), "all_reduce after a mismatch")
    # async: the error belongs to the handle, raised by wait(); the next collective still works
    work = dist.all_reduce(torch.ones(4 if RANK == 0 else 8, device=DEVICE), async_op=True)
    after = dist.all_reduce(torch.ones(3, device=DEVICE), async_op=True)
    try:
        work.wait()
    except neuron_dist.CollectiveMismatchError as error:
        assert "float32[4]" in str(error) and "float32[8]" in str(error), str(error)
    else:
        raise AssertionError("no error from wait() for mismatched async shapes")
    assert work.is_completed() and not work.is_success() and work.exception() is not None
    after.wait()
    return text


@cases.case
def same_sizes_in_different_shapes_reduce_as_with_gloo() -> None:
    """gloo and NCCL all-reduce, reduce and broadcast the flat data: ranks may pass the same number
    of elements in different shapes (this raised a mismatch error on neuron)."""
    shape = (2, 3) if RANK % 2 == 0 else (3, 2)
    tensor = torch.arange(6, dtype=torch.float32, device=DEVICE).reshape(shape) + RANK
    dist.all_reduce(tensor)
    expected = sum(torch.arange(6, dtype=torch.float32) + r for r in range(WORLD))
    _expect(tensor.reshape(-1), expected, "all_reduce of (2, 3) and (3, 2)")
    tensor = torch.full((6,) if RANK else (2, 3), float(RANK + 5), device=DEVICE)
    dist.broadcast(tensor, src=0)
    _expect(tensor.reshape(-1), torch.full((6,), 5.0), "broadcast of (2, 3) into (6,)")
    tensor = torch.ones(shape, device=DEVICE)
    dist.reduce(tensor, dst=0)
    if RANK == 0:
        _expect(tensor.reshape(-1), torch.full((6,), float(WORLD)), "reduce of (2, 3) and (3, 2)")


@cases.case
def complex_and_unsupported_reduce_ops_are_refused_on_every_rank() -> list[str]:
    """gloo refuses PRODUCT, MIN and MAX on complex tensors at once; neuron reported a transport
    failure, or for a small reduce_scatter_tensor computed the product. PREMUL_SUM raised a
    ValueError where gloo raises a RuntimeError."""
    texts = []
    value = torch.complex(torch.full((8,), RANK + 1.0), torch.ones(8))
    calls = {
        "reduce": lambda op: dist.reduce(value.clone().to(DEVICE), dst=0, op=op),
        "reduce_scatter_tensor small": lambda op: dist.reduce_scatter_tensor(
            torch.empty(8, dtype=torch.complex64, device=DEVICE), value.repeat(WORLD).to(DEVICE), op=op),
        "reduce_scatter_tensor large": lambda op: dist.reduce_scatter_tensor(
            torch.empty(1 << 18, dtype=torch.complex64, device=DEVICE),
            torch.ones(WORLD << 18, dtype=torch.complex64, device=DEVICE), op=op),
        "reduce_scatter": lambda op: dist.reduce_scatter(
            torch.empty(8, dtype=torch.complex64, device=DEVICE), [value.to(DEVICE)] * WORLD, op=op),
    }
    for name, call in calls.items():
        for op in (R.PRODUCT, R.MIN, R.MAX):
            try:
                call(op)
            except RuntimeError as error:
                assert isinstance(error, neuron_dist.CollectiveArgumentError), (name, op, repr(error))
                assert "not supported on complex tensors" in str(error), str(error)
                texts.append(str(error))
            else:
                raise AssertionError(f"{name} with {op} on complex tensors was accepted")
    try:
        dist.all_reduce(torch.ones(2, device=DEVICE), op=dist._make_nccl_premul_sum(2.0))
    except RuntimeError as error:
        assert "PREMUL_SUM is not supported" in str(error), str(error)
    else:
        raise AssertionError("PREMUL_SUM was accepted")
    tensor = value.clone().to(DEVICE)
    dist.reduce(tensor, dst=0)  # SUM is fine, and the group is still in step
    if RANK == 0:
        _expect(tensor, sum(torch.complex(torch.full((8,), r + 1.0), torch.ones(8)) for r in range(WORLD)),
                "complex SUM after the refusals")
    return texts[:1]


@cases.case
def mismatched_dtypes_raise_on_every_rank() -> str:
    dtype = torch.float32 if RANK == 0 else torch.int32  # the same width: gloo alone would mix them
    try:
        dist.all_gather_into_tensor(torch.empty(4 * WORLD, dtype=dtype, device=DEVICE), torch.ones(4, dtype=dtype, device=DEVICE))
    except neuron_dist.CollectiveMismatchError as error:
        text = str(error)
        assert "float32" in text and "int32" in text and "all_gather_into_tensor" in text, text
    else:
        raise AssertionError("no error for mismatched dtypes")
    return text


@cases.case
def mismatched_collectives_raise() -> str:
    tensor = torch.ones(4, device=DEVICE)
    try:
        if RANK == 0:
            dist.broadcast(tensor, src=0)
        else:
            dist.all_reduce(tensor)
    except neuron_dist.CollectiveMismatchError as error:
        text = str(error)
        assert "broadcast" in text and "all_reduce" in text, text
    else:
        raise AssertionError("no error for different collectives")
    return text


@cases.case
def mismatch_between_inline_and_large_raises() -> str:
    """One rank's tensor travels inside the signature exchange, the other's is too large to: the
    exchanged frames still have one size on every rank, so all of them raise (gloo would abort)."""
    texts = []
    for small_first in (True, False):  # after a large collective, and after a small one
        warm = torch.ones(1 << 20 if small_first else 8, device=DEVICE)
        dist.all_reduce(warm)
        tensor = torch.ones(8 if RANK == 0 else 1 << 20, device=DEVICE)
        try:
            dist.all_reduce(tensor)
        except neuron_dist.CollectiveMismatchError as error:
            texts.append(str(error))
            assert "float32[8]" in texts[-1] and "float32[1048576]" in texts[-1], texts[-1]
        else:
            raise AssertionError("no error for a small and a large all_reduce")
        shard = torch.ones(4 if RANK == 0 else 1 << 19, device=DEVICE)
        try:
            dist.all_gather_into_tensor(torch.empty(WORLD * shard.numel(), device=DEVICE), shard)
        except neuron_dist.CollectiveMismatchError as error:
            texts.append(str(error))
        else:
            raise AssertionError("no error for a small and a large all_gather_into_tensor")
    tensor = torch.ones(4, device=DEVICE)
    dist.all_reduce(tensor)  # still in step
    _expect(tensor, torch.full((4,), float(WORLD)), "all_reduce after the mismatches")
    return texts[0]



@cases.case
def inline_and_gloo_paths_agree_with_gloo() -> None:
    """Small (inline) and large (gloo) all_reduce, all_gather and reduce_scatter of random float32
    data equal a plain gloo group's results bitwise, on every rank alike."""
    gloo = dist.new_group(backend="gloo")
    gen = torch.Generator().manual_seed(100 + RANK)
    for numel in (10, 3 * WORLD * 1000, WORLD * (1 << 19)):
        data = torch.randn(numel, generator=gen)
        for op in (R.SUM, R.AVG, R.MAX, R.PRODUCT):
            mine, ref = data.to(DEVICE), data.clone()
            dist.all_reduce(mine, op=op)
            dist.all_reduce(ref, op=op, group=gloo)
            _expect(mine, ref, f"all_reduce {op} of {numel}")
        if numel % WORLD == 0:
            out, ref = torch.empty(numel // WORLD, device=DEVICE), torch.empty(numel // WORLD)
            dist.reduce_scatter_tensor(out, data.to(DEVICE))
            dist.reduce_scatter_tensor(ref, data.clone(), group=gloo)
            _expect(out, ref, f"reduce_scatter_tensor of {numel}")
        out, ref = torch.empty(WORLD, numel, device=DEVICE), torch.empty(WORLD * numel)
        dist.all_gather_into_tensor(out, data.to(DEVICE))  # any output shape on neuron; flat for gloo
        dist.all_gather_into_tensor(ref, data.clone(), group=gloo)
        ref = ref.view(WORLD, numel)
        _expect(out, ref, f"all_gather_into_tensor of {numel}")
    destroy_when_every_rank_is_done(gloo)


@cases.case
def speculated_collectives_agree_with_gloo_and_mismatches_still_raise() -> dict:
    """A repeating pattern of large collectives is posted together with its signature exchange
    (neuron_dist._speculation): results still equal a gloo group's bitwise, round after round
    (fresh data each round, so a stale result would show); a new size, a mismatch after the
    learnt pattern and the collectives after it behave as without speculation."""
    group = dist.new_group()  # fresh prediction state
    gloo = dist.new_group(backend="gloo")
    frames = group._get_backend(DEVICE).impl._frames
    gen = torch.Generator().manual_seed(200 + RANK)
    n = 1 << 19  # 2 MiB of float32: too large to travel inside the exchange

    def same(actual: torch.Tensor, expected: torch.Tensor, what: str) -> None:
        if not torch.equal(actual.cpu(), expected):
            raise AssertionError(f"{what}: {int((actual.cpu() != expected).sum())} elements differ from gloo's")

    for rnd in range(4):
        data = torch.randn(WORLD * n, generator=gen)
        for op in (R.SUM, R.MAX):
            mine, ref = data[:n].to(DEVICE), data[:n].clone()
            dist.all_reduce(mine, op=op, group=group)
            dist.all_reduce(ref, op=op, group=gloo)
            same(mine, ref, f"round {rnd}: all_reduce {op}")
        ints = (data[:n] * 1000).to(torch.int32)
        mine, ref = ints.to(DEVICE), ints.clone()
        dist.all_reduce(mine, op=R.MIN, group=group)
        dist.all_reduce(ref, op=R.MIN, group=gloo)
        same(mine, ref, f"round {rnd}: all_reduce MIN int32")
        out, ref = torch.empty(WORLD, n, device=DEVICE), torch.empty(WORLD * n)
        dist.all_gather_into_tensor(out, data[:n].to(DEVICE), group=group)
        dist.all_gather_into_tensor(ref, data[:n].clone(), group=gloo)
        same(out, ref.view(WORLD, n), f"round {rnd}: all_gather_into_tensor")
        out, ref = torch.empty(n, device=DEVICE), torch.empty(n)
        dist.reduce_scatter_tensor(out, data.to(DEVICE), group=group)
        dist.reduce_scatter_tensor(ref, data.clone(), group=gloo)
        same(out, ref, f"round {rnd}: reduce_scatter_tensor")
    hits = frames.speculation["hits"]
    assert hits >= 2 * 5, f"the repeated pattern was never posted early: {frames.speculation}"

    # a consistent miss: every rank predicts a 2 MiB all_reduce after the last reduce_scatter
    misses = frames.speculation["misses"]
    mine = torch.full((n + 64,), float(RANK + 1), device=DEVICE)
    dist.all_reduce(mine, group=group)
    same(mine, torch.full((n + 64,), float(sum(range(1, WORLD + 1)))), "all_reduce of a new size")
    assert frames.speculation["misses"] > misses, frames.speculation

    # learn "all_reduce after all_reduce", then only rank 0 issues it: every rank raises, and
    # rank 0's tensor (reduced with the others' stand-ins, the reduce op's identity) keeps its value
    for _ in range(4):
        dist.all_reduce(torch.ones(n, device=DEVICE), group=group)
    mine = torch.full((n if RANK == 0 else n + 8,), 3.0, device=DEVICE)
    try:
        dist.all_reduce(mine, group=group)
    except neuron_dist.CollectiveMismatchError as error:
        text = str(error)
    else:
        raise AssertionError("no error for all_reduces of different sizes")
    if RANK == 0:
        same(mine, torch.full((n,), 3.0), "rank 0's tensor after the mismatch")
    for _ in range(3):  # in step again, predictions and all
        mine = torch.ones(n, device=DEVICE)
        dist.all_reduce(mine, group=group)
        same(mine, torch.full((n,), float(WORLD)), "all_reduce after the mismatch")
    hits = frames.speculation["hits"]
    for _ in range(4):  # beyond 8 MiB the saved round trip is too small a share: not speculated
        mine = torch.ones(4 << 20, device=DEVICE)
        dist.all_reduce(mine, group=group)
        same(mine, torch.full((4 << 20,), float(WORLD)), "a 16 MiB all_reduce")
    assert frames.speculation["hits"] == hits, frames.speculation
    destroy_when_every_rank_is_done(gloo)
    destroy_when_every_rank_is_done(group)
    return {"error": text, "speculation": dict(frames.speculation)}


@cases.case
def a_repeating_mix_of_sizes_travels_inside_the_exchange() -> list[int]:
    """A barrier, then a run of all-gathers of 64 KiB shards, round after round (what
    bench/collectives.py does per block): the frame is sized for the collective the group
    predicts, so after the pattern is learnt the first all-gather after each barrier travels
    inside the exchange instead of finding a frame sized for the barrier (two round trips).
    Results equal a gloo group's, with fresh data every round."""
    group = dist.new_group()  # fresh prediction state
    gloo = dist.new_group(backend="gloo")
    frames = group._get_backend(DEVICE).impl._frames
    gen = torch.Generator().manual_seed(400 + RANK)
    n, rounds = 1 << 14, 8  # 64 KiB of float32 per rank
    without_room = []
    for rnd in range(rounds):
        dist.barrier(group=group)
        for i in range(3):
            shard = torch.randn(n, generator=gen)
            out, ref = torch.empty(WORLD * n, device=DEVICE), torch.empty(WORLD * n)
            dist.all_gather_into_tensor(out, shard.to(DEVICE), group=group)
            dist.all_gather_into_tensor(ref, shard, group=gloo)
            if not torch.equal(out.cpu(), ref):
                raise AssertionError(f"round {rnd}, all-gather {i}: differs from gloo's")
        without_room.append(frames.frame_without_room)
    # the first rounds may find no room while the pattern is learnt; none after that
    assert without_room[-1] == without_room[2], f"frames without room, cumulative per round: {without_room}"
    destroy_when_every_rank_is_done(gloo)
    destroy_when_every_rank_is_done(group)
    return without_room


@cases.case
def speculated_async_collectives_agree_with_gloo() -> dict:
    """DDP's pattern: several large async all_reduces issued back to back (queued behind each
    other's exchanges, posted from the progress thread or a waiting caller), waited in reverse
    order, with futures on some, round after round: bitwise gloo's results, and posted early."""
    group = dist.new_group()
    gloo = dist.new_group(backend="gloo")
    frames = group._get_backend(DEVICE).impl._frames
    gen = torch.Generator().manual_seed(300 + RANK)
    sizes = (1 << 19, 3 << 18, 1 << 19)  # 2, 3 and 2 MiB of float32
    for rnd in range(5):
        data = [torch.randn(n, generator=gen) for n in sizes]
        mine = [d.to(DEVICE) for d in data]
        works = [dist.all_reduce(t, group=group, async_op=True) for t in mine]
        futures = [works[1].get_future()]
        for ref in data:
            dist.all_reduce(ref, group=gloo)
        for work in reversed(works):
            work.wait()
        futures[0].wait()
        for i, (t, ref) in enumerate(zip(mine, data)):
            if not torch.equal(t.cpu(), ref):
                raise AssertionError(f"round {rnd}, bucket {i}: differs from gloo's all_reduce")
    assert frames.speculation["hits"] >= 6, frames.speculation
    destroy_when_every_rank_is_done(gloo)
    destroy_when_every_rank_is_done(group)
    return dict(frames.speculation)


@cases.case
def collectives_under_inference_mode_then_outside() -> None:
    """A group whose first collectives run under torch.inference_mode() (an evaluation loop
    before training) keeps working outside it: its reused buffers must not be inference tensors."""
    group = dist.new_group()  # fresh buffers, made under inference mode below

    def round_trip() -> None:
        for numel in (6, 3 * WORLD * 1000):
            t = _value(RANK, torch.float32, numel).to(DEVICE)
            dist.all_reduce(t, group=group)
            _expect(t, sum(_value(r, torch.float32, numel) for r in range(WORLD)), f"all_reduce of {numel}")
            out = torch.empty(WORLD * numel, device=DEVICE)
            dist.all_gather_into_tensor(out, _value(RANK, torch.float32, numel).to(DEVICE), group=group)
            _expect(out, torch.cat([_value(r, torch.float32, numel) for r in range(WORLD)]), "all_gather")
            shard = torch.empty(numel, device=DEVICE)
            dist.reduce_scatter_tensor(shard, _value(RANK, torch.float32, WORLD * numel).to(DEVICE), group=group)
            full = sum(_value(r, torch.float32, WORLD * numel) for r in range(WORLD))
            _expect(shard, full[RANK * numel:(RANK + 1) * numel], "reduce_scatter_tensor")
        # gloo's multi-input all_gather, completed through its future (the steps and the copies
        # run on another thread, which must update inference tensors in inference mode), on
        # neuron and CPU tensors
        for device in (DEVICE, "cpu"):
            inputs = [_value(RANK, torch.float32, 3).to(device) + i for i in range(2)]
            outputs = [[torch.empty(3, device=device) for _ in range(2 * WORLD)] for _ in range(2)]
            group.allgather(outputs, inputs).get_future().wait()
            for out_list in outputs:
                for j, out in enumerate(out_list):
                    expected = _value(j // 2, torch.float32, 3) + j % 2
                    assert torch.equal(out.cpu(), expected), f"multi-input all_gather on {device}: {out}"
        dist.barrier(group=group)

    with torch.inference_mode():
        round_trip()
    round_trip()
    destroy_when_every_rank_is_done(group)


@cases.case
def wrong_device_names_backend_and_device() -> str:
    """A neuron tensor on a gloo group raises naming the device instead of hanging, and a meta
    tensor on the neuron group goes to torch's meta kernel (no data moves), as it does with gloo."""
    gloo = dist.new_group(backend="gloo")
    try:
        dist.all_reduce(torch.ones(4, device=DEVICE), group=gloo)
    except RuntimeError as error:
        text = str(error)
        assert "neuron" in text, text
    else:
        raise AssertionError("no error for a neuron tensor on a gloo group")
    meta = torch.ones(4, device="meta")
    dist.all_reduce(meta)
    assert meta.device.type == "meta"
    destroy_when_every_rank_is_done(gloo)
    return text


@cases.case
def non_contiguous_tensors_raise_instead_of_corrupting() -> str:
    """gloo moves memory as one block: a strided view would be reduced as if dense (gloo's
    all_reduce, broadcast, reduce and scatter corrupt it silently); the backend refuses it on
    every path of those, as NCCL does."""
    buffer = torch.zeros(2 * 8, device=DEVICE)
    for call in (
        lambda: dist.all_reduce(buffer[::2]),  # small: would travel inside the signature exchange
        lambda: dist.broadcast(torch.zeros(1 << 19, 2, device=DEVICE)[:, 0], src=0),
        lambda: dist.reduce(buffer[::2], dst=0),
        lambda: dist.scatter(buffer[::2], [torch.zeros(8, device=DEVICE)] * WORLD if RANK == 0 else None, src=0),
        lambda: dist.reduce_scatter(buffer[::2], [torch.zeros(8, device=DEVICE)] * WORLD),  # the output
    ):
        try:
            call()
        except ValueError as error:
            text = str(error)
            assert "non-contiguous" in text and ".contiguous()" in text, text
        else:
            raise AssertionError("no error for a non-contiguous tensor")
    assert buffer.abs().sum().item() == 0  # nothing was written
    dist.all_reduce(buffer)  # the group still works
    # dense layouts other than row-major (channels_last) are fine for element-wise collectives
    image = (torch.arange(2 * 3 * 4 * 4.0).reshape(2, 3, 4, 4) + RANK).contiguous(memory_format=torch.channels_last)
    on_device = image.to(DEVICE)
    dist.all_reduce(on_device)
    expected = sum(torch.arange(2 * 3 * 4 * 4.0).reshape(2, 3, 4, 4) + r for r in range(WORLD))
    _expect(on_device, expected, "all_reduce of a channels_last tensor")
    return text


def _column(values: torch.Tensor, device: torch.device | str) -> torch.Tensor:
    """``values`` as column 0 of a (n, 2) matrix: a strided view (stride 2)."""
    matrix = torch.full((values.numel(), 2), -7, dtype=values.dtype, device=device)
    matrix[:, 0] = values.to(device)
    return matrix[:, 0]


@cases.case
def strided_tensors_work_where_gloo_copies_them() -> int:
    """gloo's all_gather, gather, all_to_all and reduce_scatter copy their tensors through flat
    buffers, so a strided view (a matrix's column) works there (PyTorch's
    test_allgather_noncontiguous_input): the same calls on the neuron backend give gloo's
    values, on neuron and CPU tensors, synchronous and async, and the work's result holds the
    caller's tensors."""
    n, checked = 4, 0

    def value(rank: int, salt: int = 0) -> torch.Tensor:
        return torch.arange(n, dtype=torch.float32) + 10 * rank + 100 * salt

    for device in (DEVICE, "cpu"):
        def col(values: torch.Tensor) -> torch.Tensor:
            return _column(values, device)

        def check(actual: torch.Tensor, expected: torch.Tensor, what: str) -> None:
            nonlocal checked
            assert actual.device.type == torch.device(device).type, f"{what}: on {actual.device}"
            if not torch.equal(actual.cpu(), expected):
                raise AssertionError(f"{what} on {device}: got {actual.cpu().tolist()}, expected {expected.tolist()}")
            checked += 1

        # list all_gather, strided input and outputs, async: the future holds the caller's outputs
        outs = [col(torch.zeros(n)) for _ in range(WORLD)]
        work = dist.all_gather(outs, col(value(RANK)), async_op=True)
        result = work.get_future().wait()
        assert all(a is b for a, b in zip(result, outs)), "the future's value is not the caller's outputs"
        for r, out in enumerate(outs):
            check(out, value(r), "all_gather")
        # several inputs per rank (gloo's multi-input all_gather) through the ProcessGroup API
        pg = dist.distributed_c10d._get_default_group()
        inputs = [col(value(RANK, i)) for i in range(2)]
        outputs = [[col(torch.zeros(n)) for _ in range(2 * WORLD)] for _ in range(2)]
        pg.allgather(outputs, inputs).wait()
        for out_list in outputs:
            for j, out in enumerate(out_list):
                check(out, value(j // 2, j % 2), "multi-input all_gather")
        # all_gather_into_tensor: strided input, then strided output
        out = torch.zeros(WORLD * n, device=device)
        dist.all_gather_into_tensor(out, col(value(RANK)))
        check(out, torch.cat([value(r) for r in range(WORLD)]), "all_gather_into_tensor, strided input")
        out = col(torch.zeros(WORLD * n))
        dist.all_gather_into_tensor(out, value(RANK).to(device))
        check(out, torch.cat([value(r) for r in range(WORLD)]), "all_gather_into_tensor, strided output")
        # gather to rank 0
        gathered = [col(torch.zeros(n)) for _ in range(WORLD)] if RANK == 0 else None
        dist.gather(col(value(RANK)), gathered, dst=0)
        for r, out in enumerate(gathered or []):
            check(out, value(r), "gather")
        # list all_to_all: strided inputs and outputs
        outs = [col(torch.zeros(n)) for _ in range(WORLD)]
        dist.all_to_all(outs, [col(value(RANK, to)) for to in range(WORLD)])
        for r, out in enumerate(outs):
            check(out, value(r, RANK), "all_to_all")
        # list reduce_scatter: strided inputs; reduce_scatter_tensor: strided input and output
        out = torch.zeros(n, device=device)
        dist.reduce_scatter(out, [col(value(RANK, to)) for to in range(WORLD)])
        check(out, sum(value(r, RANK) for r in range(WORLD)), "reduce_scatter")
        out = col(torch.zeros(n))
        dist.reduce_scatter_tensor(out, col(torch.cat([value(RANK, to) for to in range(WORLD)])))
        check(out, sum(value(r, RANK) for r in range(WORLD)), "reduce_scatter_tensor")
        # an output whose elements share memory cannot take one value each: refused, on every rank
        try:
            dist.all_gather_into_tensor(torch.zeros(1, device=device).expand(WORLD * n), value(RANK).to(device))
        except ValueError as error:
            assert "overlap" in str(error), error
        else:
            raise AssertionError("no error for an all_gather output whose elements overlap")
    dist.barrier()
    return checked


@cases.case
def group_sequence_numbers_count_collectives() -> list[int]:
    """``ProcessGroup._get_sequence_number_for_group`` (torch forwards it to gloo, NCCL and UCC
    only, and raised "does not yet support sequence numbers" for plugins) counts the group's
    collectives, as gloo's does: +1 per collective, 0 on a new group."""
    pg = dist.distributed_c10d._get_default_group()
    seen = [pg._get_sequence_number_for_group()]
    t = torch.ones(2, device=DEVICE)
    for _ in range(3):
        dist.all_reduce(t)
        seen.append(pg._get_sequence_number_for_group())
    assert [b - a for a, b in zip(seen, seen[1:])] == [1, 1, 1], seen
    group = dist.new_group()
    assert group._get_sequence_number_for_group() == 0
    dist.barrier(group=group)
    assert group._get_sequence_number_for_group() == 1
    destroy_when_every_rank_is_done(group)
    return seen[1:]


@cases.case
def tensors_that_require_grad_are_valid_arguments() -> float:
    """Collectives are not differentiable: gloo writes results outside autograd, so a tensor that
    requires grad is a valid argument. DDP's buckets require grad under
    ``backward(create_graph=True)`` (PyTorch's test_ddp_create_graph); the backend's own
    ``out=`` writes raised "functions with out=... arguments don't support automatic
    differentiation"."""
    for device in (DEVICE, "cpu"):
        for numel in (4, 1 << 18):  # inside the signature exchange, and through gloo
            w = torch.ones(numel, device=device, requires_grad=True)
            y = w * (RANK + 1)
            dist.all_reduce(y)
            assert torch.equal(y.detach().cpu(), torch.full((numel,), WORLD * (WORLD + 1) / 2)), device
            out = torch.empty(WORLD * numel, device=device, requires_grad=True)
            with torch.no_grad():  # an in-place write into a leaf that requires grad
                dist.all_gather_into_tensor(out, y.detach())
    model = torch.nn.Linear(3, 1, bias=False).to(DEVICE)
    torch.nn.init.constant_(model.weight, 1.0)
    ddp = torch.nn.parallel.DistributedDataParallel(model)
    x = torch.full((2, 3), float(RANK + 1), device=DEVICE)
    for _ in range(2):
        ddp(x).pow(2).sum().backward(create_graph=True)
    # d/dw sum((x w)^2) = 2 x^T (x w): per rank 2 * 2 * 3 * (r+1)^2 per weight, averaged, twice
    expected = 2 * sum(12.0 * (r + 1) ** 2 for r in range(WORLD)) / WORLD
    grad = model.weight.grad.detach().cpu()
    assert torch.allclose(grad, torch.full_like(grad, expected)), (grad, expected)
    return expected


@cases.case
def sparse_cpu_all_reduce_sums_like_gloo() -> list[float]:
    """Sparse COO CPU tensors all-reduce as with gloo (DDP with sparse gradients:
    ``nn.Embedding(sparse=True)``; PyTorch's test_sparse_all_reduce_sum): a sum whatever each
    rank's number of entries, written into the caller's tensor. They were refused as
    non-contiguous dense tensors. Other reductions raise gloo's error."""
    n = WORLD + 1
    t = torch.sparse_coo_tensor(torch.arange(RANK + 1).reshape(1, -1), torch.ones(RANK + 1), (n,))
    dist.all_reduce(t)
    expected = torch.tensor([float(WORLD - min(i, WORLD)) for i in range(n)])
    assert torch.equal(t.to_dense(), expected), (t.to_dense(), expected)
    uncoalesced = torch.sparse_coo_tensor(torch.tensor([[0, 0]]), torch.tensor([1.0, 2.0]), (n,))
    dist.all_reduce(uncoalesced, async_op=True).wait()
    assert uncoalesced.to_dense()[0].item() == 3.0 * WORLD, uncoalesced
    try:
        dist.all_reduce(t.clone(), op=dist.ReduceOp.MAX)
    except ValueError as error:
        assert "ReduceOp.SUM" in str(error), error
    else:
        raise AssertionError("no error for a MAX all_reduce of sparse tensors")
    # DDP with a sparse embedding gradient, on the CPU over the neuron group, against one process
    torch.manual_seed(0)
    model = torch.nn.Embedding(8, 3, sparse=True)
    reference = torch.nn.Embedding(8, 3)
    reference.weight.data.copy_(model.weight.data)
    ddp = torch.nn.parallel.DistributedDataParallel(model)
    ids = [torch.tensor([r % 8, (3 * r + 1) % 8, 5]) for r in range(WORLD)]
    ddp(ids[RANK]).sum().backward()
    for r in range(WORLD):
        (reference(ids[r]).sum() / WORLD).backward()
    assert torch.allclose(model.weight.grad.to_dense(), reference.weight.grad), "sparse DDP gradient"
    return expected.tolist()


@cases.case
def ddp_zero_overlap_hook_works_and_interleaved_is_refused() -> bool:
    """DDP + ZeroRedundancyOptimizer(overlap_with_ddp=True) with ``hook_with_zero_step`` trains as
    DDP with a local optimizer does (PyTorch's test_ddp_zero_overlap); the interleaved variant,
    which issues broadcasts from future callbacks in an order that can differ between ranks (it
    failed partway through training with a collective mismatch), is refused when made, as torch
    refuses it on gloo."""
    import copy

    from torch.distributed.algorithms.ddp_comm_hooks.ddp_zero_hook import (
        hook_with_zero_step,
        hook_with_zero_step_interleaved,
    )
    from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook
    from torch.distributed.optim import ZeroRedundancyOptimizer
    from torch.nn.parallel import DistributedDataParallel as DDP

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(100, 200), torch.nn.Linear(200, 50)).to(DEVICE)
    inputs = [torch.randn(1, 100).to(DEVICE) for _ in range(4)]
    settings = dict(lr=0.01, momentum=0.9, weight_decay=0.001)
    overlapped = DDP(copy.deepcopy(model))
    zero = ZeroRedundancyOptimizer(overlapped.parameters(), optimizer_class=torch.optim.SGD,
                                   overlap_with_ddp=True, **settings)
    try:
        hook_with_zero_step_interleaved(allreduce_hook, overlapped, zero)
    except RuntimeError as error:
        assert "hook_with_zero_step" in str(error) and "neuron" in str(error), error
    else:
        raise AssertionError("hook_with_zero_step_interleaved was accepted on a neuron group")
    overlapped.register_comm_hook(None, hook_with_zero_step(allreduce_hook, overlapped, zero))
    local = DDP(copy.deepcopy(model))
    local_opt = torch.optim.SGD(local.parameters(), **settings)
    for x in inputs[:2]:  # ZeRO's overlap needs two warm-up iterations
        overlapped(x).sum().backward()
    for x in inputs:
        zero.zero_grad()
        overlapped(x).sum().backward()
    for x in inputs:
        local_opt.zero_grad()
        local(x).sum().backward()
        local_opt.step()
    dist.barrier()
    for a, b in zip(overlapped.parameters(), local.parameters()):
        assert torch.allclose(a.detach().cpu(), b.detach().cpu(), rtol=1e-5, atol=1e-6), "ZeRO overlap diverged"
    return True


def _invalid_calls(pg: dist.ProcessGroup) -> dict[str, tuple[object, str]]:
    """Calls no rank can run (the same on every rank), with what each error must say."""
    c10d = dist.distributed_c10d

    def zeros(n: int = 1, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        return torch.zeros(n, dtype=dtype, device=DEVICE)

    def opts(kind, **fields):
        made = kind()
        for name, value in fields.items():
            setattr(made, name, value)
        return made

    root_list = [zeros() for _ in range(WORLD)]
    return {
        "broadcast root -1": (lambda: pg.broadcast([zeros()], opts(c10d.BroadcastOptions, rootRank=-1)),
                              "invalid root rank: -1"),
        "broadcast root = size": (lambda: pg.broadcast([zeros()], opts(c10d.BroadcastOptions, rootRank=WORLD)),
                                  f"invalid root rank: {WORLD}"),
        "broadcast root tensor": (lambda: pg.broadcast([zeros()], opts(c10d.BroadcastOptions, rootTensor=1)),
                                  "invalid root tensor: 1"),
        "broadcast mixed dtypes": (lambda: pg.broadcast([zeros(), zeros(1, torch.int32)]), "invalid tensor type"),
        "all_reduce mixed sizes": (lambda: pg.allreduce([zeros(1), zeros(2)]), "invalid tensor size at index 1"),
        "all_reduce_coalesced mixed dtypes": (lambda: pg.allreduce_coalesced([zeros(), zeros(1, torch.int64)]),
                                              "same type"),
        "reduce two tensors": (lambda: pg.reduce([zeros(), zeros()], opts(c10d.ReduceOptions, rootRank=0)),
                               "single-element tensor list"),
        "reduce root = size": (lambda: pg.reduce([zeros()], opts(c10d.ReduceOptions, rootRank=WORLD)),
                               "invalid root rank"),
        "gather short output list": (
            lambda: pg.gather([root_list[:-1]] if RANK == 0 else [], [zeros()], opts(c10d.GatherOptions, rootRank=0))
            if RANK == 0 else pg.gather([[zeros()]], [zeros()], opts(c10d.GatherOptions, rootRank=0)),
            "output list size" if RANK == 0 else "empty output on non-root"),
        "scatter wrong dtype": (
            lambda: pg.scatter([zeros()], [[zeros(1, torch.int64)] * WORLD] if RANK == 0 else [[zeros()]],
                               opts(c10d.ScatterOptions, rootRank=0)),
            "invalid tensor type" if RANK == 0 else "empty input on non-root"),
        "all_gather short output list": (lambda: pg.allgather([[zeros()] * (WORLD - 1)], [zeros()]),
                                         f"expected length {WORLD}"),
        "all_gather_coalesced wrong output size": (
            lambda: pg.allgather_coalesced([[zeros(2)]] * WORLD, [zeros()]), "invalid size of output tensor at index 0"),
        "all_gather wrong output size": (lambda: pg.allgather([[zeros(2)] * WORLD], [zeros()]), "invalid tensor size"),
        "all_gather_into_tensor small output": (lambda: pg._allgather_base(zeros(WORLD * 4 - 1), zeros(4)),
                                                "world_size times input tensor size"),
        "reduce_scatter_tensor wrong dtype": (lambda: pg._reduce_scatter_base(zeros(2), zeros(2 * WORLD, torch.int32)),
                                              "same type"),
        "all_to_all_single splits": (lambda: pg.alltoall_base(zeros(WORLD), zeros(WORLD), [1] * WORLD, [2] * WORLD),
                                     "split sizes"),
        "all_to_all list length": (lambda: pg.alltoall([zeros()] * (WORLD + 1), [zeros()] * (WORLD + 1)),
                                   "input list size"),
    }


@cases.case
def invalid_arguments_raise_at_call_and_leave_the_group_usable() -> list[str]:
    """As gloo does: a call no rank can run raises when it is made, before anything is sent, so
    the group stays in step (before, such calls went out and failed as transport errors)."""
    pg = dist.group.WORLD
    messages = []
    for name, (call, expected) in _invalid_calls(pg).items():
        try:
            call()
        except neuron_dist.CollectiveArgumentError as error:
            assert isinstance(error, RuntimeError) and isinstance(error, ValueError), name
            assert expected in str(error), f"{name}: {error}"
            messages.append(str(error))
        else:
            raise AssertionError(f"{name}: accepted")
    tensor = torch.full((3,), float(RANK), device=DEVICE)
    dist.all_reduce(tensor)  # every rank refused the same calls: still in step
    _expect(tensor, torch.full((3,), float(sum(range(WORLD)))), "all_reduce after refused calls")
    return messages


@cases.case
def list_all_reduce_reduces_every_tensor_of_every_rank() -> None:
    """gloo's semantics for several tensors in one all_reduce call (one per local device in the
    legacy multi-device API): one reduction over all of them, written into each."""
    pg = dist.group.WORLD
    tensors = [torch.tensor([2.0 * RANK], device=DEVICE), torch.tensor([2.0 * RANK + 1], device=DEVICE)]
    pg.allreduce(tensors).wait()
    total = float(sum(range(2 * WORLD)))
    for tensor in tensors:
        _expect(tensor, torch.tensor([total]), "list all_reduce")
    options = dist.AllreduceOptions()
    options.reduceOp = R.AVG
    try:
        pg.allreduce(tensors, options)
    except neuron_dist.CollectiveArgumentError as error:
        assert "AVG" in str(error), error
    else:
        raise AssertionError("a list all_reduce with AVG was accepted")


@cases.case
def list_collectives_follow_gloos_semantics() -> None:
    """The ProcessGroup API's list forms, as gloo runs them (PyTorch's test_c10d_gloo.py)."""
    pg = dist.group.WORLD
    # a work's future holds the one output list itself (several lists: all of them)
    outputs = [torch.full((1,), -1.0, device=DEVICE) for _ in range(WORLD)]
    value = pg.allgather([outputs], [torch.full((1,), float(RANK), device=DEVICE)]).get_future().wait()
    assert isinstance(value, list) and len(value) == WORLD and all(isinstance(t, torch.Tensor) for t in value), value
    _expect(torch.cat(value), torch.arange(WORLD, dtype=torch.float32), "all_gather future value")
    options = dist.GatherOptions()
    options.rootRank = 0
    gathered = [torch.empty(1, device=DEVICE) for _ in range(WORLD)] if RANK == 0 else []
    value = pg.gather([gathered] if RANK == 0 else [], [torch.full((1,), float(RANK), device=DEVICE)],
                      options).get_future().wait()
    assert len(value) == (WORLD if RANK == 0 else 0), value
    # several inputs: each output list holds every rank's inputs, rank by rank
    inputs = [torch.full((1,), float(2 * RANK + i), device=DEVICE) for i in range(2)]
    output_lists = [[torch.empty(1, device=DEVICE) for _ in range(2 * WORLD)] for _ in range(2)]
    pg.allgather(output_lists, inputs).wait()
    for outputs in output_lists:
        _expect(torch.cat(outputs), torch.arange(2 * WORLD, dtype=torch.float32), "multi-input all_gather")
    # coalesced all-reduce reduces each tensor once, even one listed twice
    tensor = torch.full((1,), float(RANK + 1), device=DEVICE)
    pg.allreduce_coalesced([tensor, tensor]).wait()
    _expect(tensor, torch.full((1,), float(sum(r + 1 for r in range(WORLD)))), "allreduce_coalesced of one tensor twice")
    # list reduce_scatter: input i is rank i's output, so sizes may differ by rank
    output = torch.empty(RANK + 1, device=DEVICE)
    dist.reduce_scatter(output, [torch.ones(i + 1, device=DEVICE) for i in range(WORLD)])
    _expect(output, torch.full((RANK + 1,), float(WORLD)), "reduce_scatter with a size per rank")


@cases.case
def timeouts_can_be_changed_after_init() -> None:
    """ProcessGroup.set_timeout, the backend's _set_default_timeout and torch's _set_pg_timeout
    (torchtitan shortens the timeout with it after warm-up) change the group's timeout."""
    import warnings

    group = dist.new_group(list(range(WORLD)))
    backend = group._get_backend(DEVICE)
    gloo = backend.impl._gloo
    backend._set_default_timeout(datetime.timedelta(seconds=23))
    assert backend.options._timeout == datetime.timedelta(seconds=23), backend.options._timeout
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # torch warned "only supported for either nccl or gloo"
        dist.distributed_c10d._set_pg_timeout(datetime.timedelta(seconds=7), group)
    assert backend.options._timeout == gloo.options._timeout == datetime.timedelta(seconds=7)
    group.set_timeout(datetime.timedelta(seconds=9))
    assert backend.options._timeout == gloo.options._timeout == datetime.timedelta(seconds=9)
    tensor = torch.ones(2, device=DEVICE)
    dist.all_reduce(tensor, group=group)
    _expect(tensor, torch.full((2,), float(WORLD)), "all_reduce after the timeout changed")
    destroy_when_every_rank_is_done(group)


@cases.case
def collectives_work_with_neuron_as_the_default_device() -> None:
    """After torch.set_default_device("neuron:<rank>") (as "cuda" on a GPU box) the backend's own
    host buffers must stay on the host: they followed the default device and gloo refused them."""
    torch.set_default_device(DEVICE)
    try:
        group = dist.new_group(list(range(WORLD)))  # its buffers are made under the default device
        dist.barrier(group=group)
        tensor = torch.full((4,), float(RANK))
        dist.all_reduce(tensor, group=group)
        _expect(tensor, torch.full((4,), float(sum(range(WORLD))), device="cpu"), "all_reduce")
        gathered = torch.empty(WORLD * (1 << 18))
        dist.all_gather_into_tensor(gathered, torch.full((1 << 18,), float(RANK)), group=group)  # beyond the inline size
        _expect(gathered, torch.arange(WORLD, device="cpu").repeat_interleave(1 << 18).float(), "all_gather_into_tensor")
        shard = torch.empty(2)
        dist.reduce_scatter_tensor(shard, torch.ones(2 * WORLD), group=group)
        _expect(shard, torch.full((2,), float(WORLD), device="cpu"), "reduce_scatter_tensor")
        objects = [None] * WORLD
        dist.all_gather_object(objects, {"rank": RANK}, group=group)
        assert objects == [{"rank": r} for r in range(WORLD)], objects
        destroy_when_every_rank_is_done(group)
    finally:
        torch.set_default_device(None)


@cases.case
def collectives_pass_through_c10d_dispatcher_ops() -> dict[str, int]:
    """Like gloo's and NCCL's, each collective is a c10d dispatcher op that dispatch modes see."""
    from torch.distributed.tensor.debug import CommDebugMode

    c10d = torch.ops.c10d
    tensor = _value(RANK, torch.float32).to(DEVICE)
    flat = torch.empty(6 * WORLD, device=DEVICE)
    with CommDebugMode() as mode:
        dist.all_reduce(tensor)
        dist.all_gather_into_tensor(flat, tensor)
        dist.reduce_scatter_tensor(tensor, flat)
        dist.broadcast(tensor, src=0)
        dist.all_reduce(torch.ones(3))  # CPU tensors take the same backend
    counts = mode.get_comm_counts()
    expected = {c10d.allreduce_: 2, c10d._allgather_base_: 1, c10d._reduce_scatter_base_: 1, c10d.broadcast_: 1}
    assert dict(counts) == expected, counts
    return {str(op): n for op, n in counts.items()}


@cases.case
def async_collectives_return_before_other_ranks_issue_them() -> None:
    """As with gloo and NCCL, ``async_op=True`` returns at once: rank 0 can issue all_reduces,
    then send to rank 1, which receives before it joins them; and ranks may issue async
    collectives on two groups in opposite orders. (They waited at issue for every rank until
    the group's timeout.)"""
    timeout = datetime.timedelta(seconds=30)  # a regression fails with a timeout, not a hang
    first, second = dist.new_group(timeout=timeout), dist.new_group(timeout=timeout)
    for n in (8, 1 << 20):  # travels inside the signature exchange; needs gloo's collective after it
        t = torch.full((n,), float(RANK + 1), device=DEVICE)
        if RANK == 0:
            work = dist.all_reduce(t, group=first, async_op=True)
            dist.send(torch.full((3,), 5.0, device=DEVICE), dst=1, group=first)
            work.wait()
        elif RANK == 1:
            got = torch.empty(3, device=DEVICE)
            dist.recv(got, src=0, group=first)
            _expect(got, torch.full((3,), 5.0), "recv between the ranks' all_reduce calls")
            dist.all_reduce(t, group=first)
        else:
            dist.all_reduce(t, group=first)
        _expect(t, torch.full((n,), float(sum(range(1, WORLD + 1)))), f"all_reduce of {n} issued before a send")

        # the same with the work's future, which DDP's communication hooks take
        t = torch.full((n,), float(RANK + 1), device=DEVICE)
        if RANK == 0:
            future = dist.all_reduce(t, group=first, async_op=True).get_future()
            dist.send(torch.full((3,), 5.0, device=DEVICE), dst=1, group=first)
            (reduced,) = future.wait()
            assert reduced is t
        elif RANK == 1:
            dist.recv(torch.empty(3, device=DEVICE), src=0, group=first)
            dist.all_reduce(t, group=first)
        else:
            dist.all_reduce(t, group=first)
        _expect(t, torch.full((n,), float(sum(range(1, WORLD + 1)))), f"future of an all_reduce of {n}")

        # several on one group: the later ones queue behind the first's exchange, not at issue
        ts = [torch.full((size,), float(RANK + 1), device=DEVICE) for size in (n, 8, n)]
        if RANK == 0:
            works = [dist.all_reduce(x, group=first, async_op=True) for x in ts]
            dist.send(torch.full((3,), 5.0, device=DEVICE), dst=1, group=first)
            for work in reversed(works):
                work.wait()
        else:
            if RANK == 1:
                dist.recv(torch.empty(3, device=DEVICE), src=0, group=first)
            for x in ts:
                dist.all_reduce(x, group=first)
        for x in ts:
            _expect(x, torch.full(x.shape, float(sum(range(1, WORLD + 1)))), f"queued all_reduce of {x.numel()}")

        a = torch.full((n,), float(RANK + 1), device=DEVICE)
        b = torch.full((n,), float(2 * RANK), device=DEVICE)
        if RANK % 2 == 0:
            works = [dist.all_reduce(a, group=first, async_op=True), dist.all_reduce(b, group=second, async_op=True)]
        else:
            works = [dist.all_reduce(b, group=second, async_op=True), dist.all_reduce(a, group=first, async_op=True)]
        assert not any(w.is_completed() and w.exception() is not None for w in works)
        for work in reversed(works):
            work.wait()
        _expect(a, torch.full((n,), float(sum(range(1, WORLD + 1)))), f"group A all_reduce of {n}")
        _expect(b, torch.full((n,), float(sum(2 * r for r in range(WORLD)))), f"group B all_reduce of {n}")
    destroy_when_every_rank_is_done(first)
    destroy_when_every_rank_is_done(second)


@cases.case
def blocking_collectives_run_on_the_calling_thread() -> dict:
    """Calls made with ``async_op=False`` (their caller waits at once) run their steps to the end
    in the call, without a deferred collective or the progress thread, and keep the caller's grad
    mode; an ``async_op=True`` call still takes the deferred path, and a blocking call issued
    before it is waited runs after it (queued behind it while its steps have not run)."""
    from neuron_dist import _deferred

    group = dist.new_group()
    deferred = []
    original_init = _deferred.DeferredCollective.__init__

    def counting_init(self, *args, **kwargs):
        deferred.append(1)
        original_init(self, *args, **kwargs)

    _deferred.DeferredCollective.__init__ = counting_init
    try:
        big = 3 * (1 << 18)  # 3 MiB of float32: beyond the inline limits, gloo's own collective
        for numel in (6, big):
            t = _value(RANK, torch.float32, numel).to(DEVICE)
            with torch.enable_grad():
                dist.all_reduce(t, group=group)
                assert torch.is_grad_enabled(), "a blocking all_reduce left grad mode off"
            _expect(t, sum(_value(r, torch.float32, numel) for r in range(WORLD)), f"all_reduce of {numel}")
            out = torch.empty(WORLD * numel, device=DEVICE)
            with torch.no_grad():
                dist.all_gather_into_tensor(out, _value(RANK, torch.float32, numel).to(DEVICE), group=group)
                assert not torch.is_grad_enabled(), "a blocking all_gather turned grad mode on"
            _expect(out, torch.cat([_value(r, torch.float32, numel) for r in range(WORLD)]), f"all_gather of {numel}")
            shard = torch.empty(numel, device=DEVICE)
            dist.reduce_scatter_tensor(shard, torch.cat([_value(RANK, torch.float32, numel)] * WORLD).to(DEVICE),
                                       group=group)
            _expect(shard, sum(_value(r, torch.float32, numel) for r in range(WORLD)), f"reduce_scatter of {numel}")
        b = _value(RANK, torch.int64).to(DEVICE)
        dist.broadcast(b, src=dist.get_global_rank(group, WORLD - 1), group=group)
        _expect(b, _value(WORLD - 1, torch.int64), "broadcast")
        dist.barrier(group=group)
        blocking_deferred = len(deferred)

        # async, then a blocking call issued before the async one is waited: queued behind it
        first = _value(RANK, torch.float32).to(DEVICE)
        second = _value(RANK, torch.float32).to(DEVICE)
        work = dist.all_reduce(first, op=R.MAX, group=group, async_op=True)
        dist.all_reduce(second, group=group)
        work.wait()
        _expect(first, _reference(R.MAX, torch.float32), "async all_reduce before a blocking one")
        _expect(second, _reference(R.SUM, torch.float32), "blocking all_reduce after an async one")
        mixed_deferred = len(deferred) - blocking_deferred
    finally:
        _deferred.DeferredCollective.__init__ = original_init
    assert blocking_deferred == 0, f"{blocking_deferred} blocking calls went through the deferred path"
    assert mixed_deferred >= 1, "the async all_reduce did not take the deferred path"
    destroy_when_every_rank_is_done(group)
    return {"blocking_deferred": blocking_deferred, "mixed_deferred": mixed_deferred}


@cases.case
def waited_collectives_leave_nothing_for_the_progress_thread() -> None:
    """The progress thread forgets a collective as soon as its caller's ``wait()`` claims it (it
    kept every one until its next look, so a loop of synchronous collectives kept hundreds of
    objects alive and made Python's garbage collector run ~7x as often); after such a loop, when
    the thread looks only rarely, a collective nobody waits for yet still completes."""
    from neuron_dist import _deferred

    t = torch.full((8,), float(RANK), device=DEVICE)
    retained = []
    for _ in range(300):
        dist.all_reduce(t, op=R.MAX)
        progress = _deferred._Progress._instance
        retained.append(len(progress._pending) if progress is not None else 0)
    _expect(t, torch.full((8,), float(WORLD - 1)), "300 synchronous all_reduces")
    assert not any(retained), f"waited collectives still watched after {sum(map(bool, retained))} of 300 calls"

    group = dist.new_group(timeout=datetime.timedelta(seconds=30))
    t = torch.full((8,), float(RANK + 1), device=DEVICE)
    if RANK == 0:  # rank 1 joins the all_reduce only after the send: the thread must run its steps
        future = dist.all_reduce(t, group=group, async_op=True).get_future()
        work = dist.all_reduce(torch.ones(1 << 18, device=DEVICE), group=group, async_op=True)
        dist.send(torch.ones(3, device=DEVICE), dst=1, group=group)
        future.wait()
        work.wait()
    else:
        if RANK == 1:
            dist.recv(torch.empty(3, device=DEVICE), src=0, group=group)
        dist.all_reduce(t, group=group)
        dist.all_reduce(torch.ones(1 << 18, device=DEVICE), group=group)
    _expect(t, torch.full((8,), float(sum(range(1, WORLD + 1)))), "an unwaited all_reduce after a synchronous streak")
    destroy_when_every_rank_is_done(group)


@cases.case
def cpu_tensors_also_work() -> None:
    tensor = _value(RANK, torch.float32)
    dist.all_reduce(tensor)
    assert torch.equal(tensor, _reference(R.SUM, torch.float32))


@cases.case
def fsdp_tp_meta_init_matches_single_device() -> bool | None:
    """2-D FSDP x TP built on meta (parameters end up as strided shards): initialising the shards
    gives the single-device model's parameters for the same seed, as on CUDA; 4 ranks only."""
    if WORLD != 4:
        return None
    import torch.nn as nn
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

    mesh = init_device_mesh("neuron", (2, 2), mesh_dim_names=("dp", "tp"))
    with torch.device("meta"):
        model = nn.Sequential(nn.Linear(8, 12), nn.ReLU(), nn.Linear(12, 6))
    parallelize_module(model, mesh["tp"], {"0": ColwiseParallel(), "2": RowwiseParallel()})
    fully_shard(model, mesh=mesh["dp"])
    model.to_empty(device=DEVICE)
    torch.manual_seed(3)
    model[0].reset_parameters()
    model[2].reset_parameters()
    torch.manual_seed(3)
    reference = nn.Sequential(nn.Linear(8, 12), nn.ReLU(), nn.Linear(12, 6)).to(DEVICE)
    for (name, param), want in zip(model.named_parameters(), reference.parameters()):
        got = param.full_tensor()
        if not torch.equal(got, want.detach()):
            raise AssertionError(f"{name} ({param.placements}): max diff {(got - want).abs().max().item()}")
    return True


@cases.case
def hsdp_on_2x2_mesh_matches_single_device() -> float | None:
    """FSDP2 hybrid sharding (replicate x shard) with bf16 params; 4 ranks only."""
    if WORLD != 4:
        return None
    import copy

    import torch.nn as nn
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    mesh = init_device_mesh("neuron", (2, 2), mesh_dim_names=("replicate", "shard"))
    torch.manual_seed(0)
    reference = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4)).to(DEVICE)
    model = copy.deepcopy(reference)
    fully_shard(model, mesh=mesh, mp_policy=MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32))
    batch = torch.randn(4 * WORLD, 8, generator=torch.Generator().manual_seed(1)).to(DEVICE)
    model(batch[RANK::WORLD].to(torch.bfloat16)).float().pow(2).mean().backward()
    low = copy.deepcopy(reference).to(torch.bfloat16)
    grads: dict[str, torch.Tensor] = {}
    for r in range(WORLD):
        low.zero_grad()
        low(batch[r::WORLD].to(torch.bfloat16)).float().pow(2).mean().backward()
        for name, param in low.named_parameters():
            grads[name] = grads.get(name, 0) + param.grad.float() / WORLD
    for name, param in model.named_parameters():
        assert param.device_mesh.ndim == 2, param.device_mesh
        got, want = param.grad.full_tensor().float().cpu(), grads[name].cpu()
        if not torch.allclose(got, want, atol=1e-3, rtol=1e-2):
            raise AssertionError(f"HSDP grad {name}: max abs diff {(got - want).abs().max().item()}")
    return float(sum(g.abs().sum() for g in grads.values()))


cases.run()
dist.destroy_process_group()
