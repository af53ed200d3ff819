"""``ProcessGroupNeuron``: the collectives behind ``init_process_group("neuron")``.

torch's ``ProcessGroup`` holds it through the C++ ``neuron_dist._C.PythonBackend`` (see
:mod:`neuron_dist._registration`), which calls the method here of the same collective.

Vocabulary: a *rank* is one process, bound to one emulated NeuronCore; a *group* is a set of
ranks (the world, a ``new_group``, a DeviceMesh dimension); a group's *sequence number* counts
the collectives this rank issued on it, from 1.

Every collective runs on gloo's transport (one ``ProcessGroupGloo`` per group, on the group's
store) over zero-copy CPU views of the neuron tensors, so gloo reads and writes device memory
directly. Before data moves, the ranks exchange signatures (:mod:`neuron_dist._signature`) so a
disagreement raises a clear error on every rank instead of aborting or corrupting; small
all_reduce, all_gather_into_tensor and reduce_scatter_tensor calls travel inside that exchange
and finish locally (:mod:`neuron_dist._frames`), so they cost one all-gather. A collective
returns once its exchange is posted, and the rest runs when someone waits for it, or when the
exchange completes (:mod:`neuron_dist._deferred`), so ``async_op=True`` does not wait for the
other ranks to issue it. Failures are diagnosed with the collective's name, sequence number
and the ranks that did not arrive (:mod:`neuron_dist._arrivals`). CPU tensors are accepted too
(passed to gloo as they are; sparse COO ones in a sum). Strided tensors are taken where gloo
takes them, through contiguous stand-ins (:mod:`neuron_dist._staging`), and the steps run in
the issuer's inference mode with grad off (:mod:`neuron_dist._modes`).
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable, Generator, Sequence
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist
from torch._C import _distributed_c10d as _c10d

from neuron_dist import _arguments
from neuron_dist._arrivals import ArrivalBoard
from neuron_dist._config import agree, config
from neuron_dist._deferred import DeferredCollective, DeferredWork, Steps
from neuron_dist._errors import (
    CollectiveArgumentError,
    CollectivePeerError,
    CollectiveTimeoutError,
    UnsupportedDeviceError,
)
from neuron_dist._host import host_view, host_view_lists, host_views
from neuron_dist._frames import FrameExchange
from neuron_dist._reductions import Reduction, plan_reduction, reduce_op_type
from neuron_dist._signature import Signature
from neuron_dist._speculation import GLOO_DTYPES, Launch, LaunchKey
from neuron_dist._staging import Staging, any_strided
from neuron_dist._work import NeuronWork

__all__ = ["ProcessGroupNeuron", "BACKEND_NAME"]

BACKEND_NAME = "neuron"
_SERVED_DEVICES = ("neuron", "cpu")
# Dtypes gloo moves as they are; others travel as bytes (data movement needs no arithmetic).
_RedOpType = dist.ReduceOp.RedOpType
# An inline all_reduce gathers every rank's whole tensor, which gloo's all-gather moves about half
# as fast as its all_reduce moves the tensor: worth it while latency dominates (bytes gathered, at most).
_ALL_REDUCE_INLINE_BYTES = 1 << 20
# An inline all_gather copies the shard into the exchange frame and every rank's rows out of it;
# beyond ~2 MiB gathered those copies cost more than the second round trip they save
# (bench/collectives.py: 4 MiB 1.46-1.50x gloo inline, 0.95-1.03x with the round trip).
_ALL_GATHER_INLINE_BYTES = 2 << 20
# An inline reduce_scatter gathers every rank's whole input (1 MiB input: 0.90x gloo inline,
# 1.56x speculated; 4 MiB: 1.17-1.39x inline, 1.08-1.15x speculated).
_REDUCE_SCATTER_INLINE_BYTES_SPECULATING = 2 << 20
# Speculation (posting gloo's collective with the exchange) saves one exchange round trip, ~0.5 ms
# here: under 3% of a collective beyond this size (all_reduce's tensor, all_gather's output,
# reduce_scatter's input), where the concurrent exchange's CPU cost on a busy host outweighs it
# (bench/collective_speculation.py: 16 MiB about even, at times 5-15% slower).
_SPECULATE_MAX_BYTES = 8 << 20
_GLOO_DTYPES = frozenset(GLOO_DTYPES)


def _wire(view: torch.Tensor) -> torch.Tensor:
    """``view`` in a dtype gloo can move: itself, or its bytes."""
    if view.dtype in _GLOO_DTYPES:
        return view
    if view.dtype.is_complex:
        return torch.view_as_real(view)
    return view.reshape(-1).view(torch.uint8)


def _wires(views: Sequence[torch.Tensor]) -> list[torch.Tensor]:
    return [_wire(v) for v in views]


def _as_bytes(view: torch.Tensor) -> torch.Tensor:
    """A contiguous tensor's bytes, flat."""
    return view.reshape(-1).view(torch.uint8)


def _nbytes(tensor: torch.Tensor) -> int:
    return tensor.numel() * tensor.element_size()


# Element-wise collectives: any dense layout works (e.g. channels_last), as long as every rank
# uses the same one, as with NCCL; the others lay rows out in memory order and need contiguous.
_LAYOUT_FREE_OPS = {"all_reduce", "all_reduce_coalesced", "broadcast", "reduce"}


def _dense_enough(op: str, tensor: torch.Tensor) -> bool:
    if tensor.is_contiguous():
        return True
    if op not in _LAYOUT_FREE_OPS or tensor.dim() not in (4, 5):
        return False
    layout = torch.channels_last if tensor.dim() == 4 else torch.channels_last_3d
    return tensor.is_contiguous(memory_format=layout)


def _listed(output_lists: list[list[torch.Tensor]]) -> list[Any]:
    """A list collective's result as gloo's work holds it: the one output list, or all of them."""
    return output_lists[0] if len(output_lists) == 1 else output_lists


def _rows(tensor: torch.Tensor) -> int:
    return tensor.shape[0] if tensor.dim() > 0 else 1


def _collective(
    steps: Callable[..., Steps] | None = None, *, reads: tuple[str, ...] = (), writes: tuple[str, ...] = ()
) -> Any:
    """Turns a collective's steps (see :mod:`neuron_dist._deferred`) into the method that issues it.

    ``reads`` and ``writes`` name the parameters (tensors, or lists of them) that may be strided,
    as gloo takes them (see :mod:`neuron_dist._staging`): the steps see contiguous stand-ins.
    The steps are always called with positional arguments.
    """
    if steps is None:
        return functools.partial(_collective, reads=reads, writes=writes)
    names = list(inspect.signature(steps).parameters)[1:]  # after self
    read_at, write_at = [names.index(n) for n in reads], [names.index(n) for n in writes]
    staged_at = read_at + write_at

    @functools.wraps(steps)
    def issue(self: ProcessGroupNeuron, *args: Any, blocking: bool | None = None) -> dist.Work:
        if blocking is None:  # the options come last; torch sets asyncOp=False for async_op=False
            blocking = bool(args) and getattr(args[-1], "asyncOp", True) is False
        if staged_at and any(any_strided(args[i]) for i in staged_at):
            staging = Staging(args[0] if isinstance(args[0], str) else steps.__name__.strip("_"))
            args = tuple(
                staging.read(a) if i in read_at else staging.written(a) if i in write_at else a
                for i, a in enumerate(args)
            )
            if staging:
                return self._issue(_staged(steps(self, *args), staging), blocking)
        return self._issue(steps(self, *args), blocking)

    return issue


def _staged(steps: Steps, staging: Staging) -> Steps:
    """The steps, then the stand-ins' values copied back into the caller's tensors on completion."""
    work = yield from steps
    work.add_finish(staging.copy_back, staging.restore)
    return work


class ProcessGroupNeuron:
    """Collectives for neuron (and CPU) tensors on gloo's transport; see the module docstring.

    torch's ``ProcessGroup`` holds it through :class:`neuron_dist._C.PythonBackend`, which
    forwards each ``c10d::Backend`` call to the method of the same collective here; that C++
    wrapper is what ``group._get_backend(torch.device("neuron"))`` returns (``.impl`` is this).
    """

    def __init__(
        self,
        store: dist.Store,
        rank: int,
        size: int,
        timeout: timedelta,
        global_ranks: Sequence[int] | None = None,
    ) -> None:
        self._global_ranks = list(global_ranks) if global_ranks else list(range(size))
        if size > 1:
            agree(store, rank, size, self._global_ranks)
        self._gloo = dist.ProcessGroupGloo(store, rank, size, timeout)
        self._timeout = timeout
        self._board = ArrivalBoard(store, rank, size)
        self._rank = rank
        self._size = size
        self._seq = 0  # collectives issued (a collective's number is taken when it is issued)
        self._posting = 0  # the number of the collective whose steps are starting
        self._group_name = ""
        self._check = config.check_signatures and size > 1
        inline_bytes = config.inline_bytes if self._check else 0
        self._speculate = self._check and config.speculate
        self._frames = FrameExchange(self._gloo, size, inline_bytes, self._speculate)
        self._all_reduce_inline = min(inline_bytes, _ALL_REDUCE_INLINE_BYTES)
        self._all_gather_inline = min(inline_bytes, _ALL_GATHER_INLINE_BYTES)
        self._reduce_scatter_inline = (
            min(inline_bytes, _REDUCE_SCATTER_INLINE_BYTES_SPECULATING) if self._speculate else inline_bytes
        )
        self._plans: dict[tuple[torch.dtype, Any], Reduction] = {}
        self._coalesced: list[dist.Work] | None = None
        self._last: DeferredCollective | None = None  # the last collective issued with an exchange
        self._alive = True

    # ---- identity and lifecycle (called by the C++ Backend) ---------------------------------

    def rank(self) -> int:
        """This process's rank in the group."""
        return self._rank

    def size(self) -> int:
        """The number of ranks in the group."""
        return self._size

    def _set_group_name(self, name: str) -> None:
        """Set when ``torch.distributed`` registers the group (what errors name it by)."""
        self._group_name = name

    def _group_label(self) -> str:
        """The group's description (``"default_pg"``, a mesh dimension, ...), else its name."""
        if self._group_name:
            try:
                desc = _c10d._resolve_process_group(self._group_name).group_desc
            except Exception:  # noqa: BLE001 (the group may be gone while its errors are reported)
                desc = ""
            if desc and desc != "undefined":
                return desc
        return self._group_name or "?"

    def _split(
        self, store: dist.Store, ranks: list[int], timeout: timedelta, group_name: str
    ) -> ProcessGroupNeuron | None:
        """The group of ``ranks`` (ranks in this group) for ``split_group``; None if this rank is not one.

        ``split_group`` is how DeviceMesh makes its dimension groups when the default group is
        bound to a core (``init_process_group(..., device_id=neuron:i)``). ``store`` is already
        prefixed with the new group's name, as for ``new_group``.
        """
        if self._rank not in ranks:
            return None
        return ProcessGroupNeuron(
            store, ranks.index(self._rank), len(ranks), timeout,
            global_ranks=[self._global_ranks[r] for r in ranks],
        )

    def _get_sequence_number_for_group(self) -> int:
        return self._seq

    def _set_sequence_number_for_group(self) -> None:
        """Sequence numbers start at 0 on every rank; nothing to agree on."""

    def shutdown(self) -> None:
        """Stops publishing arrivals and shuts the transport down, after starting the data
        movement of the last collective if nobody waited for it (as gloo finishes queued work)."""
        self._settle()
        self._frames.drain()
        self._alive = False
        self._board.close()
        self._gloo.shutdown()

    def _set_default_timeout(self, timeout: timedelta) -> None:
        """The timeout of collectives issued from now on (``ProcessGroup.set_timeout``)."""
        self._gloo._set_default_timeout(timeout)
        self._timeout = timeout

    def abort(self) -> None:
        """Same as :meth:`shutdown` (gloo has no separate abort)."""
        self._alive = False
        self._board.close()
        self._gloo.abort()

    def __repr__(self) -> str:
        return f"ProcessGroupNeuron(rank={self._rank}, size={self._size}, group={self._group_name!r})"

    # ---- shared machinery ------------------------------------------------------------------

    def _where(self, op: str, seq: int) -> str:
        group = self._group_label()
        return f"{op} (collective #{seq} on group {group!r}, global ranks {self._global_ranks})"

    def _check_tensors(self, op: str, tensors: Sequence[torch.Tensor]) -> None:
        for tensor in tensors:
            if tensor.device.type not in _SERVED_DEVICES:
                raise UnsupportedDeviceError(
                    f"neuron: {op} got a tensor on device '{tensor.device}', but the process group's "
                    f"backend 'neuron' only serves 'neuron' (and 'cpu') tensors. Move the tensor to "
                    f"'neuron', or create the group with the backend of device '{tensor.device.type}'."
                )
            if not _dense_enough(op, tensor):
                # gloo moves a tensor's memory as one block: a strided view would be read and
                # written as if it were dense (NCCL refuses them the same way).
                raise CollectiveArgumentError(
                    f"neuron: {op} got a non-contiguous tensor (shape {list(tensor.shape)}, strides "
                    f"{list(tensor.stride())}): Tensors must be contiguous. Pass tensor.contiguous() "
                    f"and copy the result back into the view if you need it there."
                )

    def _begin(
        self,
        signature: Signature,
        tensors: Sequence[torch.Tensor],
        payload: torch.Tensor | None = None,
        wanted: int = 0,
        launch: Launch | None = None,
    ) -> Generator[dist.Work, None, tuple[int, bool]]:
        """Numbers the collective, checks devices, and checks the signature against the other ranks.

        Used as ``seq, inline = yield from self._begin(...)`` by a collective's steps: it posts
        the signature exchange and yields it; the steps resume (see :meth:`_issue`) once the
        caller waits, or the exchange completed. Returns the sequence number, and whether
        ``payload`` travelled inside the exchange on every rank (:meth:`FrameExchange.complete`;
        the caller then finishes the collective locally from ``self._frames.last``). ``launch``
        is the collective's gloo operation when it does not inline, for the exchange to post
        early if the group predicted it; :meth:`_launched` then returns its work.
        """
        op = signature.op
        self._check_tensors(op, tensors)
        seq = self._posting
        self._board.enter(seq)
        if not (self._check or (op == "barrier" and self._size > 1)):
            return seq, False
        diagnose = lambda error: self._diagnose(op, seq, error)  # noqa: E731
        try:
            posted = self._frames.post(signature, seq, payload, wanted, launch)
        except Exception as error:  # noqa: BLE001 (gloo raises plain RuntimeError)
            raise diagnose(error) from error
        yield posted.work
        return seq, self._frames.complete(posted, lambda: self._where(op, seq), diagnose)

    def _launched(self, launch: Launch) -> Callable[[], dist.Work]:
        """How a collective that passed ``launch`` to :meth:`_begin` starts its data movement:
        with the work the exchange already posted, if the prediction held, else by posting it."""
        work = self._frames.take_speculated()
        if work is not None:
            return lambda: work
        return launch.post

    def _reduction_launch(self, kind: str, dtype: torch.dtype, numel: int, reduce_op: Any,
                          post: Callable[[Reduction], dist.Work]) -> Launch | None:
        """The :class:`Launch` of a reduction that gloo runs on the caller's dtype with one of its
        own ops (AVG divides by the ranks, so a stand-in could not leave values unchanged)."""
        if not self._speculate or dtype not in _GLOO_DTYPES or numel * dtype.itemsize > _SPECULATE_MAX_BYTES:
            return None
        try:
            plan = self._plan(dtype, reduce_op, kind, self._posting)
        except ValueError:
            return None  # raised after the exchange, as for any collective
        if plan.wire_dtype is not None or plan.divisor or plan.op == _RedOpType.AVG:
            return None
        return Launch(LaunchKey(kind, dtype, numel, plan.op), lambda: post(plan))

    def _issue(self, steps: Steps, blocking: bool = False) -> dist.Work:
        """Numbers a collective and starts its steps, or queues them behind the group's previous
        collective if its steps have not run; returns the work (deferred while the steps wait
        for an exchange). The number is taken here, so ``_get_sequence_number_for_group`` (what
        ``TORCH_DISTRIBUTED_DEBUG=DETAIL`` fingerprints calls with) counts every issued call.

        A ``blocking`` call (``async_op=False``: its caller waits for the work at once) runs its
        steps to the end here when nothing is queued before it, without the deferred machinery."""
        self._seq += 1
        if blocking and self._coalesced is None and (self._last is None or self._last.finished):
            return self._run_now(self._numbered(steps, self._seq))
        collective = DeferredCollective(self._numbered(steps, self._seq), lambda: self._alive)
        if self._last is not None and collective.queue_behind(self._last):
            work: dist.Work = DeferredWork(collective)
            self._last = collective
        else:
            try:
                exchange = collective.start()
            except StopIteration as done:
                work = done.value
                self._last = None
            except BaseException:
                self._seq -= 1  # refused before anything was sent (a bad argument): not issued
                raise
            else:
                collective.posted(exchange)
                work = DeferredWork(collective)
                self._last = collective
        if self._coalesced is not None:
            self._coalesced.append(work)
        return work

    def _run_now(self, steps: Steps) -> dist.Work:
        """Runs numbered steps to their end on this thread (see :meth:`_issue`), without grad as
        the deferred path runs them; errors raise here, as :meth:`DeferredWork.wait` raises them."""
        self._last = None
        grad = torch.is_grad_enabled()
        if grad:
            torch._C._set_grad_enabled(False)
        try:
            try:
                next(steps)
            except StopIteration as done:
                return done.value
            except BaseException:
                self._seq -= 1  # refused before anything was sent (a bad argument): not issued
                raise
            try:
                steps.send(None)
            except StopIteration as done:
                return done.value
        finally:
            if grad:
                torch._C._set_grad_enabled(True)
        steps.close()
        raise RuntimeError("neuron: internal error: a collective's steps yielded twice")

    def _numbered(self, steps: Steps, seq: int) -> Steps:
        """``steps``, started with ``seq`` as the number :meth:`_begin` gives the collective."""
        self._posting = seq
        return (yield from steps)

    def _settle(self) -> None:
        """Runs the steps of this group's collectives that nobody waited for yet, in order."""
        last, self._last = self._last, None
        if last is not None:
            last.run()  # errors stay with each collective's work

    def _plan(self, dtype: torch.dtype, reduce_op: Any, op: str, seq: int) -> Reduction:
        key = (dtype, reduce_op_type(reduce_op))
        plan = self._plans.get(key)
        if plan is None:
            plan = self._plans[key] = plan_reduction(dtype, reduce_op, self._size, self._where(op, seq))
        return plan

    def _inlines(self, dtype: torch.dtype, reduce_op: Any) -> bool:
        """Whether a reduction may finish locally from all-gathered data with gloo's exact result.

        With 2 ranks there is one (commutative) combination; integer ops, MIN and MAX do not depend
        on the order. Floating SUM/AVG/PRODUCT over more ranks keep gloo's own reduction order.
        """
        return (
            self._size == 2
            or not (dtype.is_floating_point or dtype.is_complex)
            or reduce_op_type(reduce_op) in (_RedOpType.MIN, _RedOpType.MAX)
        )

    def _completed(self, result: Any) -> NeuronWork:
        """The handle of a collective that already finished (its data travelled in the exchange)."""
        return NeuronWork([], result)

    def _diagnose(self, op: str, seq: int, error: BaseException) -> BaseException:
        """A clear error for a failed collective: what, which number, who did not arrive."""
        if isinstance(error, (CollectiveTimeoutError, CollectivePeerError)):
            return error
        cause = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        timed_out = "timed out" in cause.lower() or "timeout" in cause.lower()
        missing = self._board.missing(seq)
        if missing is None:
            who = "could not tell which ranks did not arrive (the store is unreachable: its host rank may be gone)"
        elif missing:
            who = (
                f"ranks that did not arrive: {[self._global_ranks[r] for r in missing]} (gone, hung, "
                f"or blocked in another call that waits for this rank)"
            )
        else:
            who = "every rank had arrived (one failed during the collective)"
        if timed_out:
            return CollectiveTimeoutError(
                f"neuron: {self._where(op, seq)} timed out after {self._timeout}; {who}. "
                f"Transport error: {cause}"
            )
        hint = " (a peer closed its connection: did a rank exit or crash?)" if "closed" in cause.lower() else ""
        return CollectivePeerError(f"neuron: {self._where(op, seq)} failed{hint}; {who}. Transport error: {cause}")

    def _launch(
        self,
        op: str,
        seq: int,
        start: Callable[[], dist.Work | list[dist.Work]],
        result: Any,
        keep: Any,
        finish: Callable[[], None] | None = None,
    ) -> NeuronWork:
        try:
            works = start()
        except Exception as error:  # noqa: BLE001
            if isinstance(error, (ValueError, TypeError)):
                raise
            raise self._diagnose(op, seq, error) from error
        return NeuronWork(
            works if isinstance(works, list) else [works],
            result,
            finish=finish,
            diagnose=lambda error: self._diagnose(op, seq, error),
            keep=keep,
        )

    # ---- reductions -------------------------------------------------------------------------

    def allreduce(self, tensors: list[torch.Tensor], opts: _c10d.AllreduceOptions | None = None) -> NeuronWork:
        """All-reduce of ``tensors`` (one per call in practice) with ``opts.reduceOp``."""
        opts = opts if opts is not None else _c10d.AllreduceOptions()
        _arguments.check_allreduce("all_reduce", tensors)
        if len(tensors) > 1 and reduce_op_type(opts.reduceOp) == _RedOpType.AVG:
            raise CollectiveArgumentError("neuron: all_reduce: ReduceOp.AVG takes a single-element tensor list")
        if tensors[0].layout == torch.sparse_coo:
            _arguments.check_sparse_allreduce(tensors, reduce_op_type(opts.reduceOp) == _RedOpType.SUM)
            return self._sparse_allreduce(tensors, opts)
        return self._allreduce("all_reduce", tensors, opts.reduceOp, opts.timeout, blocking=not opts.asyncOp)

    @_collective
    def _sparse_allreduce(self, tensors: list[torch.Tensor], opts: _c10d.AllreduceOptions) -> Steps:
        """Sum of sparse COO CPU tensors (DDP with sparse gradients, e.g. ``nn.Embedding(sparse=True)``):
        gloo's sparse all-reduce, which agrees on each rank's number of entries itself and writes
        the coalesced sum into the caller's tensors."""
        first = tensors[0]
        signature = Signature("all_reduce_sparse", first.dtype, tuple(first.shape), reduce_op=int(_RedOpType.SUM))
        seq, _ = yield from self._begin(signature, [])  # sparse: no dense layout to check
        return self._launch("all_reduce", seq, lambda: self._gloo.allreduce(tensors, opts), tensors, tensors)

    def allreduce_coalesced(
        self, tensors: list[torch.Tensor], opts: _c10d.AllreduceCoalescedOptions | None = None
    ) -> NeuronWork:
        """All-reduce of several tensors as one collective."""
        opts = opts if opts is not None else _c10d.AllreduceCoalescedOptions()
        _arguments.check_allreduce("all_reduce_coalesced", tensors)
        return self._allreduce("all_reduce_coalesced", tensors, opts.reduceOp, opts.timeout,
                               blocking=not opts.asyncOp)

    @_collective
    def _allreduce(self, op: str, tensors: list[torch.Tensor], reduce_op: Any, timeout: timedelta) -> Steps:
        first = tensors[0]
        single = (
            len(tensors) == 1
            and self._size * _nbytes(first) <= self._all_reduce_inline
            and self._inlines(first.dtype, reduce_op)
        )
        signature = Signature(
            op, first.dtype, tuple(first.shape), numel=sum(t.numel() for t in tensors),
            reduce_op=int(reduce_op_type(reduce_op)),
        )
        view = host_view(first) if single or len(tensors) == 1 else None
        launch = None
        if not single and op == "all_reduce" and len(tensors) == 1:

            def post(plan: Reduction) -> dist.Work:
                gloo_opts = _c10d.AllreduceOptions()
                gloo_opts.reduceOp = plan.op
                gloo_opts.timeout = timeout
                return self._gloo.allreduce([view], gloo_opts)

            launch = self._reduction_launch("all_reduce", first.dtype, first.numel(), reduce_op, post)
        seq, inline = yield from self._begin(signature, tensors, view if single else None,
                                             _nbytes(first) if single else 0, launch)
        plan = self._plan(first.dtype, reduce_op, op, seq)
        if inline:
            plan.reduce_rows(self._frames.last.rank_rows(first.dtype, 0, first.shape), view)
            return self._completed(tensors)
        if launch is not None:
            return self._launch(op, seq, self._launched(launch), tensors, tensors)
        views = [view] if single else host_views(tensors)
        wires = [plan.to_wire(v) for v in views]
        gloo_opts = _c10d.AllreduceOptions()
        gloo_opts.reduceOp = plan.op
        gloo_opts.timeout = timeout

        def finish() -> None:
            for wire, view in zip(wires, views):
                plan.from_wire(wire, view)

        if op == "all_reduce":  # several tensors: one reduction over all of them, gloo's semantics
            start = lambda: self._gloo.allreduce(wires, gloo_opts)  # noqa: E731
        else:  # coalesced: each tensor its own reduction, all in one flat buffer (gloo's semantics)
            coalesced_opts = _c10d.AllreduceCoalescedOptions()
            coalesced_opts.reduceOp = plan.op
            coalesced_opts.timeout = timeout
            start = lambda: self._gloo.allreduce_coalesced(wires, coalesced_opts)  # noqa: E731
        return self._launch(op, seq, start, tensors, tensors, finish)

    def reduce(self, tensors: list[torch.Tensor], opts: _c10d.ReduceOptions | None = None) -> dist.Work:
        """Reduce to ``opts.rootRank``."""
        opts = opts if opts is not None else _c10d.ReduceOptions()
        _arguments.check_reduce(tensors, opts.rootRank, opts.rootTensor, self._size)
        return self._reduce(tensors, opts)

    @_collective
    def _reduce(self, tensors: list[torch.Tensor], opts: _c10d.ReduceOptions) -> Steps:
        tensor = tensors[0]
        signature = Signature(
            "reduce", tensor.dtype, tuple(tensor.shape), root=opts.rootRank,
            reduce_op=int(reduce_op_type(opts.reduceOp)),
        )
        seq, _ = yield from self._begin(signature, tensors)
        plan = self._plan(tensor.dtype, opts.reduceOp, "reduce", seq)
        view = host_view(tensor)
        wire = plan.to_wire(view)
        gloo_opts = _c10d.ReduceOptions()
        gloo_opts.reduceOp = plan.op
        gloo_opts.rootRank = opts.rootRank
        gloo_opts.rootTensor = opts.rootTensor
        gloo_opts.timeout = opts.timeout
        is_root = self._rank == opts.rootRank
        return self._launch(
            "reduce", seq, lambda: self._gloo.reduce([wire], gloo_opts), tensors, tensors,
            lambda: plan.from_wire(wire, view, divide=is_root),
        )

    def reduce_scatter(
        self,
        outputs: list[torch.Tensor],
        input_lists: list[list[torch.Tensor]],
        opts: _c10d.ReduceScatterOptions | None = None,
    ) -> dist.Work:
        """Reduce-scatter from a list of per-rank inputs."""
        opts = opts if opts is not None else _c10d.ReduceScatterOptions()
        _arguments.check_reduce_scatter(outputs, input_lists, self._rank, self._size)
        return self._reduce_scatter(outputs, input_lists, opts)

    @_collective(reads=("input_lists",))
    def _reduce_scatter(
        self, outputs: list[torch.Tensor], input_lists: list[list[torch.Tensor]], opts: _c10d.ReduceScatterOptions
    ) -> Steps:
        output = outputs[0]
        # the inputs are the same on every rank; outputs may differ in size (rank i's is input i)
        signature = Signature(
            "reduce_scatter", output.dtype, (), numel=sum(t.numel() for t in input_lists[0]),
            reduce_op=int(reduce_op_type(opts.reduceOp)),
        )
        seq, _ = yield from self._begin(signature, [*outputs, *input_lists[0]])
        plan = self._plan(output.dtype, opts.reduceOp, "reduce_scatter", seq)
        out_view = host_view(output)
        out_wire = plan.to_wire(out_view)
        in_wires = [plan.to_wire(v) for v in host_views(input_lists[0])]
        gloo_opts = self._reduce_scatter_opts(plan.op, opts)
        return self._launch(
            "reduce_scatter", seq, lambda: self._gloo.reduce_scatter([out_wire], [in_wires], gloo_opts),
            outputs, (outputs, input_lists), lambda: plan.from_wire(out_wire, out_view),
        )

    def reduce_scatter_single(
        self, output: torch.Tensor, input: torch.Tensor, opts: _c10d.ReduceScatterOptions | None = None
    ) -> NeuronWork:
        """Reduce-scatter of one flat input into this rank's chunk (``reduce_scatter_tensor``)."""
        opts = opts if opts is not None else _c10d.ReduceScatterOptions()
        _arguments.check_reduce_scatter_tensor("reduce_scatter_tensor", [output], [input], self._size)
        return self._reduce_scatter_tensors("reduce_scatter_tensor", [output], [input], opts)

    _reduce_scatter_base = reduce_scatter_single

    def reduce_scatter_single_coalesced(
        self,
        outputs: list[torch.Tensor],
        inputs: list[torch.Tensor],
        opts: _c10d.ReduceScatterOptions | None = None,
    ) -> NeuronWork:
        """Several ``reduce_scatter_tensor`` calls as one collective."""
        opts = opts if opts is not None else _c10d.ReduceScatterOptions()
        _arguments.check_reduce_scatter_tensor("reduce_scatter_tensor_coalesced", outputs, inputs, self._size)
        return self._reduce_scatter_tensors("reduce_scatter_tensor_coalesced", outputs, inputs, opts)

    reduce_scatter_tensor_coalesced = reduce_scatter_single_coalesced

    @_collective(reads=("inputs",), writes=("outputs",))
    def _reduce_scatter_tensors(
        self, op: str, outputs: list[torch.Tensor], inputs: list[torch.Tensor], opts: _c10d.ReduceScatterOptions
    ) -> Steps:
        first = inputs[0]
        signature = Signature(
            op, first.dtype, tuple(first.shape), numel=sum(t.numel() for t in inputs),
            reduce_op=int(reduce_op_type(opts.reduceOp)),
        )
        one = len(inputs) == 1 and len(outputs) == 1 and self._check
        single = one and self._inlines(first.dtype, opts.reduceOp)
        payload = launch = None
        if one:
            in_view, out_view = host_view(first), host_view(outputs[0])
            chunk = out_view.numel()
            flat = in_view.numel() == chunk * self._size and in_view.dtype == out_view.dtype
            if single and flat and self._size * _nbytes(first) <= self._reduce_scatter_inline:
                payload = in_view
            elif flat:
                in_flat, out_flat = in_view.reshape(-1), out_view.reshape(-1)

                def post(plan: Reduction) -> dist.Work:
                    return self._gloo._reduce_scatter_base(out_flat, in_flat, self._reduce_scatter_opts(plan.op, opts))

                launch = self._reduction_launch("reduce_scatter", first.dtype, first.numel(), opts.reduceOp, post)
        wanted = _nbytes(first) if single else 0
        seq, inline = yield from self._begin(signature, [*outputs, *inputs], payload, wanted, launch)
        plan = self._plan(first.dtype, opts.reduceOp, op, seq)
        if inline:
            plan.reduce_rows(self._frames.last.rank_rows(first.dtype, self._rank * chunk, out_view.shape), out_view)
            return self._completed(outputs)
        if launch is not None:
            return self._launch(op, seq, self._launched(launch), outputs, (outputs, inputs))
        out_views = [v.reshape(-1) for v in host_views(outputs)]
        out_wires = [plan.to_wire(v) for v in out_views]
        in_wires = [plan.to_wire(v.reshape(-1)) for v in host_views(inputs)]
        gloo_opts = self._reduce_scatter_opts(plan.op, opts)

        def finish() -> None:
            for wire, view in zip(out_wires, out_views):
                plan.from_wire(wire, view)

        return self._launch(
            op, seq,
            lambda: [self._gloo._reduce_scatter_base(o, i, gloo_opts) for o, i in zip(out_wires, in_wires)],
            outputs, (outputs, inputs), finish,
        )

    @staticmethod
    def _reduce_scatter_opts(op: Any, opts: _c10d.ReduceScatterOptions) -> _c10d.ReduceScatterOptions:
        gloo_opts = _c10d.ReduceScatterOptions()
        gloo_opts.reduceOp = op
        gloo_opts.timeout = opts.timeout
        return gloo_opts

    # ---- data movement ----------------------------------------------------------------------

    def broadcast(self, tensors: list[torch.Tensor], opts: _c10d.BroadcastOptions | None = None) -> dist.Work:
        """Broadcast from ``opts.rootRank``."""
        opts = opts if opts is not None else _c10d.BroadcastOptions()
        _arguments.check_broadcast(tensors, opts.rootRank, opts.rootTensor, self._size)
        return self._broadcast(tensors, opts)

    @_collective
    def _broadcast(self, tensors: list[torch.Tensor], opts: _c10d.BroadcastOptions) -> Steps:
        tensor = tensors[0]
        signature = Signature("broadcast", tensor.dtype, tuple(tensor.shape), root=opts.rootRank)
        seq, _ = yield from self._begin(signature, tensors)
        wires = _wires(host_views(tensors))
        return self._launch("broadcast", seq, lambda: self._gloo.broadcast(wires, opts), tensors, tensors)

    def allgather(
        self,
        output_lists: list[list[torch.Tensor]],
        inputs: list[torch.Tensor],
        opts: _c10d.AllgatherOptions | None = None,
    ) -> dist.Work:
        """All-gather into a list of per-rank outputs."""
        opts = opts if opts is not None else _c10d.AllgatherOptions()
        _arguments.check_allgather(output_lists, inputs, self._size)
        return self._allgather(output_lists, inputs, opts)

    @_collective(reads=("inputs",), writes=("output_lists",))
    def _allgather(
        self, output_lists: list[list[torch.Tensor]], inputs: list[torch.Tensor], opts: _c10d.AllgatherOptions
    ) -> Steps:
        tensor = inputs[0]
        signature = Signature("all_gather", tensor.dtype, tuple(tensor.shape), numel=sum(t.numel() for t in inputs))
        seq, _ = yield from self._begin(signature, [*inputs, *output_lists[0]])
        outs = [_wires(vs) for vs in host_view_lists(output_lists)]
        ins = _wires(host_views(inputs))
        return self._launch(
            "all_gather", seq, lambda: self._gloo.allgather(outs, ins, opts), _listed(output_lists),
            (output_lists, inputs),
        )

    def allgather_coalesced(
        self,
        output_lists: list[list[torch.Tensor]],
        inputs: list[torch.Tensor],
        opts: _c10d.AllgatherOptions | None = None,
    ) -> dist.Work:
        """Several list all-gathers as one collective."""
        opts = opts if opts is not None else _c10d.AllgatherOptions()
        _arguments.check_allgather_coalesced(output_lists, inputs, self._size)
        return self._allgather_coalesced(output_lists, inputs, opts)

    @_collective
    def _allgather_coalesced(
        self, output_lists: list[list[torch.Tensor]], inputs: list[torch.Tensor], opts: _c10d.AllgatherOptions
    ) -> Steps:
        tensor = inputs[0]
        signature = Signature(
            "all_gather_coalesced", tensor.dtype, tuple(tensor.shape), numel=sum(t.numel() for t in inputs)
        )
        seq, _ = yield from self._begin(signature, inputs)
        outs = [_wires(vs) for vs in host_view_lists(output_lists)]
        ins = _wires(host_views(inputs))
        return self._launch(
            "all_gather_coalesced", seq, lambda: self._gloo.allgather_coalesced(outs, ins, opts),
            output_lists, (output_lists, inputs),
        )

    def all_gather_single(
        self, output: torch.Tensor, input: torch.Tensor, opts: _c10d.AllgatherOptions | None = None
    ) -> NeuronWork:
        """All-gather into one flat output (``all_gather_into_tensor``)."""
        opts = opts if opts is not None else _c10d.AllgatherOptions()
        _arguments.check_allgather_into_tensor("all_gather_into_tensor", [output], [input], self._size)
        return self._all_gather_tensors("all_gather_into_tensor", [output], [input], opts)

    _allgather_base = all_gather_single

    def all_gather_single_coalesced(
        self,
        outputs: list[torch.Tensor],
        inputs: list[torch.Tensor],
        opts: _c10d.AllgatherOptions | None = None,
    ) -> NeuronWork:
        """Several ``all_gather_into_tensor`` calls as one collective."""
        opts = opts if opts is not None else _c10d.AllgatherOptions()
        _arguments.check_allgather_into_tensor("all_gather_into_tensor_coalesced", outputs, inputs, self._size)
        return self._all_gather_tensors("all_gather_into_tensor_coalesced", outputs, inputs, opts)

    allgather_into_tensor_coalesced = all_gather_single_coalesced

    @_collective(reads=("inputs",), writes=("outputs",))
    def _all_gather_tensors(
        self, op: str, outputs: list[torch.Tensor], inputs: list[torch.Tensor], opts: _c10d.AllgatherOptions
    ) -> Steps:
        first = inputs[0]
        single = len(inputs) == 1 and len(outputs) == 1 and self._check
        signature = Signature(op, first.dtype, tuple(first.shape), numel=sum(t.numel() for t in inputs))
        payload = launch = None
        if single:  # inline when the output is one flat buffer of the ranks' inputs in rank order
            in_view, out_view = host_view(first), host_view(outputs[0])
            fits = out_view.numel() == first.numel() * self._size and out_view.dtype == first.dtype
            small = self._size * _nbytes(first) <= self._all_gather_inline
            if fits and small and out_view.is_contiguous():
                payload = in_view
            elif fits and self._speculate and _nbytes(out_view) <= _SPECULATE_MAX_BYTES:
                out_wire, in_wire = _wire(out_view.reshape(-1)), _wire(in_view.reshape(-1))
                launch = Launch(
                    LaunchKey("all_gather", in_wire.dtype, in_wire.numel()),
                    lambda: self._gloo._allgather_base(out_wire, in_wire, opts),
                )
        nbytes = _nbytes(first)
        seq, inline = yield from self._begin(
            signature, [*outputs, *inputs], payload, nbytes if payload is not None else 0, launch
        )
        if inline:
            self._frames.last.copy_rows(out_view.data_ptr(), nbytes)  # out_view: contiguous, checked above
            return self._completed(outputs)
        if launch is not None:
            return self._launch(op, seq, self._launched(launch), outputs, (outputs, inputs))
        # flat buffers: gloo insists on an output shaped (world, *input.shape); NCCL (and we) take any shape
        outs = _wires([v.reshape(-1) for v in host_views(outputs)])
        ins = _wires([v.reshape(-1) for v in host_views(inputs)])
        return self._launch(
            op, seq, lambda: [self._gloo._allgather_base(o, i, opts) for o, i in zip(outs, ins)],
            outputs, (outputs, inputs),
        )

    def all_to_all_single(
        self,
        output: torch.Tensor,
        input: torch.Tensor,
        output_split_sizes: list[int],
        input_split_sizes: list[int],
        opts: _c10d.AllToAllOptions | None = None,
    ) -> dist.Work:
        """All-to-all of one flat tensor, split along dim 0 (equally when no split sizes are given)."""
        opts = opts if opts is not None else _c10d.AllToAllOptions()
        _arguments.check_alltoall_single(output, input, output_split_sizes, input_split_sizes, self._size)
        return self._all_to_all_single(output, input, output_split_sizes, input_split_sizes, opts)

    @_collective
    def _all_to_all_single(
        self,
        output: torch.Tensor,
        input: torch.Tensor,
        output_split_sizes: list[int],
        input_split_sizes: list[int],
        opts: _c10d.AllToAllOptions,
    ) -> Steps:
        n = self.size()
        in_splits = list(input_split_sizes) or [_rows(input) // n] * n
        out_splits = list(output_split_sizes) or [_rows(output) // n] * n
        signature = Signature(
            "all_to_all_single", input.dtype, tuple(input.shape[1:]), numel=input.numel(),
            in_splits=tuple(in_splits), out_splits=tuple(out_splits),
        )
        seq, _ = yield from self._begin(signature, [output, input])
        out_view, in_view = host_view(output), host_view(input)
        if input.dtype not in _GLOO_DTYPES:  # move bytes: a row of each becomes a row of bytes
            out_view = out_view.reshape(_rows(output), -1).view(torch.uint8)
            in_view = in_view.reshape(_rows(input), -1).view(torch.uint8)
        return self._launch(
            "all_to_all_single", seq,
            lambda: self._gloo.alltoall_base(out_view, in_view, list(output_split_sizes), list(input_split_sizes), opts),
            [output], (output, input),
        )

    alltoall_base = all_to_all_single

    def alltoall(
        self, outputs: list[torch.Tensor], inputs: list[torch.Tensor], opts: _c10d.AllToAllOptions | None = None
    ) -> dist.Work:
        """All-to-all of per-rank tensor lists."""
        opts = opts if opts is not None else _c10d.AllToAllOptions()
        _arguments.check_alltoall(outputs, inputs, self._size)
        return self._alltoall(outputs, inputs, opts)

    @_collective(reads=("inputs",), writes=("outputs",))
    def _alltoall(self, outputs: list[torch.Tensor], inputs: list[torch.Tensor], opts: _c10d.AllToAllOptions) -> Steps:
        first = inputs[0]
        signature = Signature(
            "all_to_all", first.dtype, (), numel=sum(t.numel() for t in inputs),
            in_splits=tuple(t.numel() for t in inputs), out_splits=tuple(t.numel() for t in outputs),
        )
        seq, _ = yield from self._begin(signature, [*outputs, *inputs])
        if len({t.numel() for t in (*inputs, *outputs)}) > 1:
            return self._uneven_alltoall(seq, outputs, inputs, opts)
        outs = _wires(host_views(outputs))
        ins = _wires(host_views(inputs))
        return self._launch(
            "all_to_all", seq, lambda: self._gloo.alltoall(outs, ins, opts), outputs, (outputs, inputs)
        )

    def _uneven_alltoall(
        self, seq: int, outputs: list[torch.Tensor], inputs: list[torch.Tensor], opts: _c10d.AllToAllOptions
    ) -> NeuronWork:
        """All-to-all of tensors of different sizes (NCCL takes them; gloo's list all-to-all does not):
        the inputs' bytes travel as one flat all-to-all with byte splits, copied into the outputs."""
        send = torch.cat([_as_bytes(v.contiguous()) for v in host_views(inputs)])
        out_views = host_views(outputs)
        out_sizes = [_nbytes(t) for t in outputs]
        recv = torch.empty(sum(out_sizes), dtype=torch.uint8, device="cpu")

        def finish() -> None:
            for view, part in zip(out_views, recv.split(out_sizes)):
                view.copy_(part.view(view.dtype).view(view.shape))

        in_sizes = [_nbytes(t) for t in inputs]
        return self._launch(
            "all_to_all", seq, lambda: self._gloo.alltoall_base(recv, send, out_sizes, in_sizes, opts),
            outputs, (outputs, inputs, send, recv), finish,
        )

    def gather(
        self,
        output_lists: list[list[torch.Tensor]],
        inputs: list[torch.Tensor],
        opts: _c10d.GatherOptions | None = None,
    ) -> dist.Work:
        """Gather to ``opts.rootRank``."""
        opts = opts if opts is not None else _c10d.GatherOptions()
        _arguments.check_gather(output_lists, inputs, opts.rootRank, self._rank, self._size)
        return self._gather(output_lists, inputs, opts)

    @_collective(reads=("inputs",), writes=("output_lists",))
    def _gather(
        self, output_lists: list[list[torch.Tensor]], inputs: list[torch.Tensor], opts: _c10d.GatherOptions
    ) -> Steps:
        tensor = inputs[0]
        signature = Signature("gather", tensor.dtype, tuple(tensor.shape), root=opts.rootRank)
        seq, _ = yield from self._begin(signature, [*inputs, *(t for ts in output_lists for t in ts)])
        outs = [_wires(vs) for vs in host_view_lists(output_lists)]
        ins = _wires(host_views(inputs))
        return self._launch(
            "gather", seq, lambda: self._gloo.gather(outs, ins, opts), _listed(output_lists), (output_lists, inputs)
        )

    def scatter(
        self,
        outputs: list[torch.Tensor],
        input_lists: list[list[torch.Tensor]],
        opts: _c10d.ScatterOptions | None = None,
    ) -> dist.Work:
        """Scatter from ``opts.rootRank``."""
        opts = opts if opts is not None else _c10d.ScatterOptions()
        _arguments.check_scatter(outputs, input_lists, opts.rootRank, self._rank, self._size)
        return self._scatter(outputs, input_lists, opts)

    @_collective
    def _scatter(
        self, outputs: list[torch.Tensor], input_lists: list[list[torch.Tensor]], opts: _c10d.ScatterOptions
    ) -> Steps:
        tensor = outputs[0]
        signature = Signature("scatter", tensor.dtype, tuple(tensor.shape), root=opts.rootRank)
        seq, _ = yield from self._begin(signature, [*outputs, *(t for ts in input_lists for t in ts)])
        outs = _wires(host_views(outputs))
        ins = [_wires(vs) for vs in host_view_lists(input_lists)]
        return self._launch(
            "scatter", seq, lambda: self._gloo.scatter(outs, ins, opts), outputs, (outputs, input_lists)
        )

    @_collective
    def barrier(self, opts: _c10d.BarrierOptions | None = None) -> Steps:
        """Returns once every rank of the group entered the barrier (the signature exchange is one)."""
        yield from self._begin(Signature("barrier"), [])
        return NeuronWork([], [])

    def monitored_barrier(self, timeout: timedelta | None = None, wait_all_ranks: bool = False) -> None:
        """gloo's monitored barrier, which names the ranks that fail to respond."""
        self._settle()
        if timeout is None:
            self._gloo.monitored_barrier(wait_all_ranks=wait_all_ranks)
        else:
            self._gloo.monitored_barrier(timeout, wait_all_ranks)

    # ---- point to point ---------------------------------------------------------------------

    def send(self, tensors: list[torch.Tensor], dst: int, tag: int = 0) -> NeuronWork:
        """Sends to group rank ``dst``."""
        self._check_tensors("send", tensors)
        wires = _wires(host_views(tensors))
        return self._p2p("send", lambda: self._gloo.send(wires, dst, tag), tensors)

    def recv(self, tensors: list[torch.Tensor], src: int, tag: int = 0) -> NeuronWork:
        """Receives from group rank ``src``."""
        self._check_tensors("recv", tensors)
        wires = _wires(host_views(tensors))
        return self._p2p("recv", lambda: self._gloo.recv(wires, src, tag), tensors)

    def recv_anysource(self, tensors: list[torch.Tensor], tag: int = 0) -> NeuronWork:
        """Receives from whichever rank sends first."""
        self._check_tensors("recv", tensors)
        wires = _wires(host_views(tensors))
        return self._p2p("recv", lambda: self._gloo.recv_anysource(wires, tag), tensors)

    def _p2p(self, op: str, start: Callable[[], dist.Work], tensors: list[torch.Tensor]) -> NeuronWork:
        def diagnose(error: BaseException) -> BaseException:
            where = f"{op} on group {self._group_label()!r}"
            cls = CollectiveTimeoutError if "timed out" in str(error).lower() else CollectivePeerError
            return cls(f"neuron: {where} failed: {str(error).strip().splitlines()[0] if str(error).strip() else error!r}")

        try:
            work = start()
        except Exception as error:  # noqa: BLE001
            raise diagnose(error) from error
        handle = NeuronWork([work], tensors, diagnose=diagnose, keep=tensors)
        if self._coalesced is not None:  # batch_isend_irecv waits only on the coalesced work
            self._coalesced.append(handle)
        return handle

    # ---- coalescing (``_coalescing_manager``) --------------------------------------------------

    def _start_coalescing(self) -> None:
        if self._coalesced is not None:
            raise RuntimeError("neuron: _start_coalescing called twice without _end_coalescing")
        self._coalesced = []

    def _end_coalescing(self) -> NeuronWork:
        works, self._coalesced = self._coalesced or [], None
        return NeuronWork(list(works), [])
