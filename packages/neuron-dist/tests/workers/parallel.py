"""DDP, FSDP2 (fp32 and bf16 mixed precision), tensor/sequence parallelism and DTensor on the
"neuron" backend with 2 ranks, each compared with the same computation on a single device."""

from __future__ import annotations

import copy

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
from torch.distributed.tensor import DTensor, Replicate, Shard, distribute_tensor
from torch.distributed.tensor.parallel import (
    ColwiseParallel,
    RowwiseParallel,
    SequenceParallel,
    parallelize_module,
)
from torch.nn.parallel import DistributedDataParallel

from _cases import Cases, destroy_when_every_rank_is_done

cases = Cases()
dist.init_process_group("neuron")
RANK, WORLD = dist.get_rank(), dist.get_world_size()
DEVICE = torch.device("neuron", torch.neuron.current_device())
MESH = init_device_mesh("neuron", (WORLD,))
DIM = 16


def _close(a: torch.Tensor, b: torch.Tensor, what: str, atol: float = 1e-5, rtol: float = 1e-4) -> None:
    a, b = (t.full_tensor() if isinstance(t, DTensor) else t for t in (a, b))
    a, b = a.detach().float().cpu(), b.detach().float().cpu()
    if not torch.allclose(a, b, atol=atol, rtol=rtol):
        raise AssertionError(f"{what}: max abs diff {(a - b).abs().max().item()}")



def _mlp() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(DIM, 4 * DIM), nn.GELU(), nn.Linear(4 * DIM, DIM), nn.GELU(), nn.Linear(DIM, DIM))


def _batches() -> torch.Tensor:
    """The global batch (same on every rank); rank r trains on rows [r::WORLD]."""
    gen = torch.Generator().manual_seed(1)
    return torch.randn(4 * WORLD, DIM, generator=gen).to(DEVICE)


def _reference_grads(model: nn.Module, batch: torch.Tensor) -> tuple[float, dict[str, torch.Tensor]]:
    """Loss and grads of a single-device model on the whole batch (mean over ranks' mean losses)."""
    model.zero_grad()
    losses = [model(batch[r::WORLD]).pow(2).mean() for r in range(WORLD)]
    loss = torch.stack(losses).mean()
    loss.backward()
    return loss.item(), {n: p.grad.clone() for n, p in model.named_parameters()}


@cases.case
def ddp_matches_single_device() -> float:
    reference = _mlp().to(DEVICE)
    ddp = DistributedDataParallel(copy.deepcopy(reference))
    batch = _batches()
    ref_loss, ref_grads = _reference_grads(reference, batch)
    loss = ddp(batch[RANK::WORLD]).pow(2).mean()
    loss.backward()
    mean_loss = loss.detach().clone()
    dist.all_reduce(mean_loss, op=dist.ReduceOp.AVG)
    _close(mean_loss, torch.tensor(ref_loss), "loss")
    for name, param in ddp.module.named_parameters():
        assert param.grad.device == DEVICE, param.grad.device
        _close(param.grad, ref_grads[name], f"grad {name}")
    return ref_loss


@cases.case
def ddp_device_ids_moves_cpu_inputs() -> float:
    """DDP with device_ids copies CPU inputs to the core on a side stream (record_stream)."""
    reference = _mlp().to(DEVICE)
    ddp = DistributedDataParallel(copy.deepcopy(reference), device_ids=[DEVICE.index])
    batch = _batches()
    ref_loss, ref_grads = _reference_grads(reference, batch)
    loss = ddp(batch[RANK::WORLD].cpu()).pow(2).mean()
    assert loss.device == DEVICE, loss.device
    loss.backward()
    for name, param in ddp.module.named_parameters():
        _close(param.grad, ref_grads[name], f"grad {name}")
    return ref_loss


@cases.case
def ddp_bf16_compress_hook() -> float:
    """torch accepts the bf16 hook only on CUDA+NCCL or XPU builds; the neuron backend reduces bf16."""
    from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import bf16_compress_hook

    reference = _mlp().to(DEVICE)
    ddp = DistributedDataParallel(copy.deepcopy(reference))
    ddp.register_comm_hook(None, bf16_compress_hook)
    batch = _batches()
    ref_loss, ref_grads = _reference_grads(reference, batch)
    ddp(batch[RANK::WORLD]).pow(2).mean().backward()
    for name, param in ddp.module.named_parameters():
        assert param.grad.dtype == torch.float32, param.grad.dtype
        _close(param.grad, ref_grads[name], f"grad {name}", atol=1e-2, rtol=1e-2)  # bf16 tolerance
    return ref_loss


@cases.case
def ddp_builtin_cpp_comm_hooks_match_single_device() -> list[str]:
    """DDP's C++ built-in hooks read the collective's future as a tensor list: FP16_COMPRESS
    failed an internal assert when the neuron work's future held the tensors as a Python list."""
    batch = _batches()
    reference = _mlp().to(DEVICE)
    ref_loss, ref_grads = _reference_grads(reference, batch)
    future = dist.all_reduce(torch.ones(2, device=DEVICE), async_op=True).get_future()
    assert [type(v) for v in future.wait()] == [torch.Tensor], future.value()
    done = []
    for hook, tolerance in ((dist.BuiltinCommHookType.ALLREDUCE, 1e-6), (dist.BuiltinCommHookType.FP16_COMPRESS, 1e-3)):
        ddp = DistributedDataParallel(copy.deepcopy(reference))
        ddp._register_builtin_comm_hook(hook)
        ddp(batch[RANK::WORLD]).pow(2).mean().backward()
        for name, param in ddp.module.named_parameters():
            _close(param.grad, ref_grads[name], f"{hook} grad {name}", atol=tolerance, rtol=tolerance)
        done.append(str(hook))
    return done


@cases.case
def ddp_power_sgd_hook_matches_gloo() -> float:
    """PowerSGD's hook waits, inside a ``.then()`` callback, for further collectives' futures:
    callbacks run on a delivery thread, so those collectives progress (run on the thread that
    runs the collectives' steps, the first compressed step waited for itself forever). The
    parameters after the compressed steps equal the same DDP run on gloo with CPU tensors."""
    from torch.distributed.algorithms.ddp_comm_hooks.powerSGD_hook import PowerSGDState, powerSGD_hook

    gloo = dist.new_group(backend="gloo")
    runs = {}
    for device, group in ((DEVICE, None), (torch.device("cpu"), gloo)):
        model = _mlp().to(device)
        ddp = DistributedDataParallel(model, process_group=group)
        state = PowerSGDState(process_group=group, matrix_approximation_rank=2, start_powerSGD_iter=2, random_seed=0)
        ddp.register_comm_hook(state, powerSGD_hook)
        opt = torch.optim.SGD(ddp.parameters(), lr=0.1)
        batch = _batches().to(device)
        for _ in range(4):  # steps 2 and 3 are compressed
            opt.zero_grad()
            ddp(batch[RANK::WORLD]).pow(2).mean().backward()
            opt.step()
        runs[device.type] = [p.detach().cpu() for p in model.parameters()]
    for mine, reference in zip(runs["neuron"], runs["cpu"]):
        _close(mine, reference, "parameter after PowerSGD steps", atol=1e-6, rtol=1e-5)
    destroy_when_every_rank_is_done(gloo)
    return float(sum(p.sum() for p in runs["neuron"]))


class _Scaled(nn.Module):
    """An MLP with a buffer: DDP broadcasts buffers at the start of every forward."""

    def __init__(self) -> None:
        super().__init__()
        self.mlp = _mlp()
        self.register_buffer("scale", torch.linspace(0.5, 1.5, DIM))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.mlp(x) * self.scale


@cases.case
def ddp_compiled_runs_the_backend_outside_dynamo() -> int:
    """torch.compile(DDP(model)): the buffer broadcast between graphs enters the backend's Python
    implementation, which Dynamo traced as user code (graph breaks, one recompile per call)."""
    import warnings

    torch._dynamo.reset()
    reference = _Scaled().to(DEVICE)
    ddp = DistributedDataParallel(copy.deepcopy(reference))
    compiled = torch.compile(ddp, backend="neuron")
    batch = _batches()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for _ in range(3):
            ddp.zero_grad()
            compiled(batch[RANK::WORLD]).pow(2).mean().backward()
    dynamo_warnings = [str(w.message).splitlines()[0] for w in caught if "Dynamo" in str(w.message)]
    assert not dynamo_warnings, dynamo_warnings
    graphs = torch._dynamo.utils.counters["stats"]["unique_graphs"]
    assert graphs <= 2, f"{graphs} graphs: Dynamo compiled code outside the model"
    _, ref_grads = _reference_grads(reference, batch)
    for name, param in ddp.module.named_parameters():
        _close(param.grad, ref_grads[name], f"grad {name}")
    return graphs


@cases.case
def ddp_records_runtime_stats() -> bool:
    """DDP's reducer times forward, backward and communication with a timer for the device."""
    ddp = DistributedDataParallel(_mlp().to(DEVICE))
    batch = _batches()
    for _ in range(2):  # DDP logs runtime stats from the second iteration on
        ddp(batch[RANK::WORLD]).pow(2).mean().backward()
    stats = ddp._get_ddp_logging_data()
    assert stats.get("avg_forward_compute_time", 0) > 0, stats
    assert stats.get("avg_backward_comm_time", 0) > 0, stats
    return True


def _conv_bn() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Conv2d(3, 4, 3, padding=1), nn.BatchNorm2d(4), nn.ReLU(), nn.Conv2d(4, 2, 1))


@cases.case
def sync_batch_norm_matches_single_device_batch_norm() -> float:
    """nn.SyncBatchNorm under DDP: output, gradients and running statistics equal one device's
    BatchNorm over the whole batch (its kernels are CUDA-only in ATen; the runtime provides them)."""
    reference = _conv_bn()
    batch = torch.randn(4 * WORLD, 3, 5, 5, generator=torch.Generator().manual_seed(1))
    target = reference(batch)
    target.pow(2).mean().backward()
    model = DistributedDataParallel(nn.SyncBatchNorm.convert_sync_batchnorm(_conv_bn()).to(DEVICE))
    out = model(batch[RANK * 4:(RANK + 1) * 4].to(DEVICE))
    (out.pow(2).mean() / WORLD).backward()  # DDP averages: the per-rank mean times 1/WORLD sums to the global mean
    _close(out, target[RANK * 4:(RANK + 1) * 4], "SyncBatchNorm output")
    for (name, got), want in zip(model.module.named_parameters(), reference.parameters()):
        _close(got.grad * WORLD, want.grad, f"SyncBatchNorm grad {name}")
    bn, ref_bn = model.module[1], reference[1]
    _close(bn.running_mean, ref_bn.running_mean, "running_mean")
    _close(bn.running_var, ref_bn.running_var, "running_var")
    return float(bn.running_var.sum())


def _fsdp_step(mp: MixedPrecisionPolicy | None, reference: nn.Module) -> tuple[torch.Tensor, nn.Module]:
    model = copy.deepcopy(reference)
    kwargs = {"mesh": MESH} | ({"mp_policy": mp} if mp else {})
    for layer in model:
        if isinstance(layer, nn.Linear):
            fully_shard(layer, **kwargs)
    fully_shard(model, **kwargs)
    batch = _batches()
    loss = model(batch[RANK::WORLD]).pow(2).mean()
    loss.backward()
    mean_loss = loss.detach().float().clone()
    dist.all_reduce(mean_loss, op=dist.ReduceOp.AVG)
    return mean_loss, model


@cases.case
def fsdp2_fp32_matches_single_device() -> float:
    reference = _mlp().to(DEVICE)
    loss, model = _fsdp_step(None, reference)
    ref_loss, ref_grads = _reference_grads(reference, _batches())
    _close(loss, torch.tensor(ref_loss), "loss")
    for name, param in model.named_parameters():
        assert isinstance(param, DTensor) and param.device == DEVICE
        _close(param.grad.full_tensor(), ref_grads[name], f"grad {name}")
    return ref_loss


@cases.case
def fsdp2_collectives_visible_to_comm_debug_mode() -> dict[str, int]:
    """FSDP2's all-gathers and reduce-scatters pass through the c10d dispatcher ops, so
    CommDebugMode (which PyTorch's FSDP tests count collectives with) sees each of them."""
    from torch.distributed.tensor.debug import CommDebugMode

    c10d = torch.ops.c10d
    with CommDebugMode() as mode:
        _fsdp_step(None, _mlp().to(DEVICE))
    counts = mode.get_comm_counts()
    layers = sum(isinstance(layer, nn.Linear) for layer in _mlp())
    assert counts[c10d._reduce_scatter_base_] == layers, counts  # one per sharded layer
    assert counts[c10d._allgather_base_] >= layers, counts  # forward (and backward re-gathers)
    assert counts[c10d.allreduce_] == 1, counts  # the loss average
    return {str(op): n for op, n in counts.items()}


@cases.case
def fsdp2_bf16_mixed_precision_matches_single_device() -> float:
    reference = _mlp().to(DEVICE)
    mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    loss, model = _fsdp_step(mp, reference)
    # The single-device equivalent: bf16 compute per rank batch, fp32 average of the grads.
    bf16 = copy.deepcopy(reference).to(torch.bfloat16)
    batch = _batches()
    grads: dict[str, torch.Tensor] = {}
    losses = []
    for r in range(WORLD):
        bf16.zero_grad()
        rank_loss = bf16(batch[r::WORLD].to(torch.bfloat16)).pow(2).mean()
        rank_loss.backward()
        losses.append(rank_loss.float())
        for name, param in bf16.named_parameters():
            grads[name] = grads.get(name, 0) + param.grad.float() / WORLD
    _close(loss, torch.stack(losses).mean(), "loss", atol=1e-3, rtol=1e-3)
    for name, param in model.named_parameters():
        assert param.dtype == torch.float32 and param.grad.dtype == torch.float32
        _close(param.grad.full_tensor(), grads[name], f"grad {name}", atol=1e-3, rtol=1e-2)
    return loss.item()


class _Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.norm = nn.LayerNorm(DIM)
        self.up = nn.Linear(DIM, 4 * DIM)
        self.down = nn.Linear(4 * DIM, DIM)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down(torch.relu(self.up(self.norm(x))))


def _tp_check(plan: dict, sequence_parallel: bool) -> float:
    reference = _Block().to(DEVICE)
    model = parallelize_module(copy.deepcopy(reference), MESH, plan)
    gen = torch.Generator().manual_seed(2)
    x = torch.randn(2, 8, DIM, generator=gen).to(DEVICE)  # (batch, sequence, hidden), same on all ranks
    if sequence_parallel:
        out = model(distribute_tensor(x, MESH, [Shard(1)]).to_local())
        out = DTensor.from_local(out, MESH, [Shard(1)]).full_tensor()
    else:
        out = model(x)
    out.pow(2).mean().backward()
    ref_out = reference(x)
    ref_out.pow(2).mean().backward()
    _close(out, ref_out, "output")
    for (name, param), ref in zip(model.named_parameters(), reference.parameters()):
        grad = param.grad.full_tensor() if isinstance(param.grad, DTensor) else param.grad
        _close(grad, ref.grad, f"grad {name}")
    return ref_out.pow(2).mean().item()


@cases.case
def tensor_parallel_colwise_rowwise() -> float:
    return _tp_check({"up": ColwiseParallel(), "down": RowwiseParallel()}, sequence_parallel=False)


@cases.case
def sequence_parallel_plan() -> float:
    plan = {
        "norm": SequenceParallel(),
        "up": ColwiseParallel(input_layouts=Shard(1)),
        "down": RowwiseParallel(output_layouts=Shard(1)),
    }
    return _tp_check(plan, sequence_parallel=True)


@cases.case
def dtensor_distribute_redistribute_ops() -> None:
    gen = torch.Generator().manual_seed(3)
    a = torch.randn(8, 6, generator=gen).to(DEVICE)
    b = torch.randn(6, 4, generator=gen).to(DEVICE)
    da = distribute_tensor(a, MESH, [Shard(0)])
    db = distribute_tensor(b, MESH, [Replicate()])
    assert da.to_local().device == DEVICE and da.to_local().shape == (8 // WORLD, 6)
    _close(da.full_tensor(), a, "full_tensor")
    _close((da @ db).full_tensor(), a @ b, "matmul")
    _close(da.sum(), a.sum(), "sum")  # a Partial -> Replicate all_reduce
    _close(da.redistribute(MESH, [Shard(1)]).full_tensor(), a, "Shard(0) -> Shard(1) (all_to_all)")
    _close(da.redistribute(MESH, [Replicate()]).to_local(), a, "Shard(0) -> Replicate (all_gather)")
    partial = DTensor.from_local(a, MESH, [torch.distributed.tensor.Partial()])
    _close(partial.redistribute(MESH, [Shard(0)]).full_tensor(), a * WORLD, "Partial -> Shard (reduce_scatter)")


def _generator_digest() -> list[int]:
    """Every rank's neuron generator state, summarised (equal states: equal lists on all ranks)."""
    state = torch.neuron.get_rng_state()
    digest = [int(state.sum()), int((state.to(torch.int64) * torch.arange(state.numel())).sum())]
    every = [None] * WORLD
    dist.all_gather_object(every, digest)
    return every


@cases.case
def dtensor_random_ops_match_the_unsharded_op() -> bool:
    """As on CUDA: a random op on a sharded DTensor gives each shard its part of what the op draws
    on the whole tensor for the same seed, and every rank's generator advances alike (uneven
    shards too). Before, each rank drew its own shard, so ranks seeded alike got equal shards."""
    rows = 4 * WORLD + 1  # uneven shards
    torch.manual_seed(7)
    weight = distribute_tensor(torch.empty(rows, 6, device=DEVICE), MESH, [Shard(0)])
    torch.nn.init.kaiming_uniform_(weight, a=0.1)  # how FSDP2/TP modules initialise parameters
    columns = distribute_tensor(torch.empty(6, rows, device=DEVICE), MESH, [Shard(1)])
    torch.nn.init.normal_(columns)
    replicated = distribute_tensor(torch.empty(3, 3, device=DEVICE), MESH, [Replicate()])
    torch.nn.init.uniform_(replicated)
    factory = torch.distributed.tensor.randn(rows, 5, device_mesh=MESH, placements=[Shard(0)])
    digest = _generator_digest()
    assert len({str(d) for d in digest}) == 1, f"generators out of step: {digest}"

    torch.manual_seed(7)  # the same ops on whole tensors, one device
    expected = [torch.nn.init.kaiming_uniform_(torch.empty(rows, 6, device=DEVICE), a=0.1),
                torch.nn.init.normal_(torch.empty(6, rows, device=DEVICE)),
                torch.nn.init.uniform_(torch.empty(3, 3, device=DEVICE)),
                torch.randn(rows, 5, device=DEVICE)]
    for got, want, what in zip((weight, columns, replicated, factory), expected,
                               ("kaiming_uniform_ Shard(0)", "normal_ Shard(1)", "uniform_ Replicate", "randn")):
        _close(got, want, what, atol=0, rtol=0)

    activations = torch.randn(rows, 8, generator=torch.Generator().manual_seed(3)).to(DEVICE)
    torch.manual_seed(11)
    dropped = torch.nn.functional.dropout(distribute_tensor(activations, MESH, [Shard(0)]), p=0.5, training=True)
    torch.manual_seed(11)
    _close(dropped, torch.nn.functional.dropout(activations, p=0.5, training=True), "dropout", atol=0, rtol=0)

    generator = torch.Generator(DEVICE).manual_seed(5)  # an explicit generator advances as unsharded
    torch.nn.init.uniform_(weight, generator=generator)
    reference = torch.Generator(DEVICE).manual_seed(5)
    _close(weight, torch.nn.init.uniform_(torch.empty(rows, 6, device=DEVICE), generator=reference),
           "uniform_ with a generator", atol=0, rtol=0)
    assert torch.equal(generator.get_state(), reference.get_state()), "the generator advanced differently"
    return True


@cases.case
def dtensor_random_ops_compile() -> bool:
    """torch.compile of random ops on sharded DTensors traces them (per shard: the rank's mesh
    coordinate is symbolic there); tracing failed on a data-dependent guard."""
    x = distribute_tensor(torch.ones(8, 4, device=DEVICE), MESH, [Shard(0)])
    dropout = torch.compile(lambda t: torch.nn.functional.dropout(t, 0.5, training=True), backend="aot_eager",
                            fullgraph=True)
    out = dropout(x).to_local()
    kept = out != 0
    assert out.shape == (8 // WORLD, 4) and torch.equal(out[kept].cpu(), torch.full((int(kept.sum()),), 2.0))
    noise = torch.compile(torch.rand_like, backend="aot_eager", fullgraph=True)(x)
    assert noise.to_local().shape == (8 // WORLD, 4) and bool(((noise.to_local() >= 0) & (noise.to_local() < 1)).all())
    return True


@cases.case
def fsdp2_meta_device_init_matches_single_device_init() -> bool:
    """FSDP2's recipe for models too large for one device: build on meta, shard, allocate the
    shards, initialise them. The parameters equal a single-device model's for the same seed."""
    with torch.device("meta"):
        model = nn.Sequential(nn.Linear(DIM, 3 * DIM + 1), nn.GELU(), nn.Linear(3 * DIM + 1, DIM))
    for layer in model:
        if isinstance(layer, nn.Linear):
            fully_shard(layer, mesh=MESH)
    fully_shard(model, mesh=MESH)
    model.to_empty(device=DEVICE)
    torch.manual_seed(21)
    for layer in model:
        if isinstance(layer, nn.Linear):
            layer.reset_parameters()
    torch.manual_seed(21)
    reference = nn.Sequential(nn.Linear(DIM, 3 * DIM + 1), nn.GELU(), nn.Linear(3 * DIM + 1, DIM)).to(DEVICE)
    for (name, param), want in zip(model.named_parameters(), reference.parameters()):
        _close(param, want, f"FSDP2 meta init of {name}", atol=0, rtol=0)
    return True


@cases.case
def dtensor_compiled_with_functional_collectives() -> None:
    """A DTensor program under torch.compile traces its collectives as functional collectives."""
    gen = torch.Generator().manual_seed(4)
    a = torch.randn(8, 4, generator=gen).to(DEVICE)

    def program(x: DTensor) -> torch.Tensor:
        return (x.redistribute(MESH, [Replicate()]) * 2).to_local()

    compiled = torch.compile(program, backend="aot_eager", fullgraph=True)
    _close(compiled(distribute_tensor(a, MESH, [Shard(0)])), a * 2, "compiled redistribute")


cases.run()
dist.destroy_process_group()
