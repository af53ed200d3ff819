"""The caching allocator: statistics, capacity and out-of-memory behaviour."""

from __future__ import annotations

import pytest
import torch

MiB = 1 << 20


def test_allocated_and_reserved_track_tensors():
    torch.neuron.empty_cache()
    base = torch.neuron.memory_allocated()
    x = torch.empty(4 * MiB, dtype=torch.uint8, device="neuron")
    assert torch.neuron.memory_allocated() == base + 4 * MiB
    assert torch.neuron.memory_reserved() >= torch.neuron.memory_allocated()
    del x
    assert torch.neuron.memory_allocated() == base
    assert torch.neuron.memory_reserved() >= 4 * MiB  # cached, not returned
    torch.neuron.empty_cache()
    assert torch.neuron.memory_reserved() == torch.neuron.memory_stats()["reserved_bytes.all.current"]


def test_peak_and_reset():
    torch.neuron.reset_peak_memory_stats()
    base = torch.neuron.max_memory_allocated()
    x = torch.empty(8 * MiB, dtype=torch.uint8, device="neuron")
    del x
    assert torch.neuron.max_memory_allocated() >= base + 8 * MiB
    torch.neuron.reset_peak_memory_stats()
    assert torch.neuron.max_memory_allocated() == torch.neuron.memory_allocated()


def test_allocated_counts_requests_rounded_to_512_bytes_as_cuda_does():
    """CUDA's allocator splits a larger block down to the request rounded to 512 B: its
    memory_allocated counts that, and the rest as an inactive split block (reserved, not
    allocated). Budgets and PyTorch's FSDP memory tests compare memory_allocated with tensor
    sizes; neuron counted whole 2 MiB-rounded blocks (a 4.5 MiB tensor as 6 MiB)."""
    torch.neuron.empty_cache()
    before = torch.neuron.memory_stats()
    sizes = [int(4.5 * MiB), 3 * MiB + 4, 100]
    tensors = [torch.empty(n, dtype=torch.uint8, device="neuron") for n in sizes]
    after = torch.neuron.memory_stats()
    delta = {key: after[key] - before[key] for key in after if key.endswith(".all.current")}
    expected = sum((n + 511) // 512 * 512 for n in sizes)
    assert delta["allocated_bytes.all.current"] == expected
    assert delta["active_bytes.all.current"] == expected
    assert delta["requested_bytes.all.current"] == sum(sizes)
    assert delta["reserved_bytes.all.current"] == 6 * MiB + 4 * MiB + 512  # what the core holds
    assert delta["inactive_split_bytes.all.current"] == delta["reserved_bytes.all.current"] - expected
    assert delta["inactive_split.all.current"] == 2
    # a cached 6 MiB block serving a 3.5 MiB request: 3.5 MiB allocated, 2.5 MiB split off
    del tensors[0]
    reuse = torch.empty(int(3.5 * MiB), dtype=torch.uint8, device="neuron")
    assert torch.neuron.memory_reserved() == after["reserved_bytes.all.current"]
    assert torch.neuron.memory_allocated() == before["allocated_bytes.all.current"] + expected - MiB
    del reuse, tensors
    final = torch.neuron.memory_stats()
    for key in ("allocated_bytes.all.current", "inactive_split_bytes.all.current", "inactive_split.all.current"):
        assert final[key] == before[key], key


def test_cached_block_is_reused():
    x = torch.empty(3 * MiB, dtype=torch.uint8, device="neuron")
    ptr = x.data_ptr()
    del x
    y = torch.empty(3 * MiB, dtype=torch.uint8, device="neuron")
    assert y.data_ptr() == ptr


@pytest.mark.parametrize("nbytes", [64 * 1024, 3 * MiB], ids=["small pool", "large pool"])
def test_the_block_freed_last_is_reused_first(nbytes):
    """Among cached blocks of one size the allocator hands out the one freed last, as malloc
    does: its bytes are still in the host's caches. It handed out the one freed first, so a
    loop that frees and allocates one buffer cycled through every cached block of that size
    (with 64 blocks of 256 KiB cached, an add took 23-35 us on neuron against ~15 on the CPU)."""
    torch.neuron.empty_cache()
    blocks = [torch.empty(nbytes, dtype=torch.uint8, device="neuron") for _ in range(4)]
    addresses = [block.data_ptr() for block in blocks]
    while blocks:  # freed in list order: the last block is freed last
        blocks.pop(0)
    for _ in range(3):
        again = torch.empty(nbytes, dtype=torch.uint8, device="neuron")
        assert again.data_ptr() == addresses[-1]
        del again
    both = [torch.empty(nbytes, dtype=torch.uint8, device="neuron") for _ in range(2)]
    assert [t.data_ptr() for t in both] == [addresses[-1], addresses[-2]]


def test_memory_is_per_core():
    before = torch.neuron.memory_allocated(1)
    x = torch.empty(2 * MiB, dtype=torch.uint8, device="neuron:1")
    assert torch.neuron.memory_allocated(1) == before + 2 * MiB
    del x


def test_stats_match_torch_accelerator_api():
    x = torch.empty(MiB, dtype=torch.uint8, device="neuron")
    assert torch.accelerator.memory_allocated(0) == torch.neuron.memory_allocated(0)
    stats = torch.neuron.memory_stats()
    for key in ("allocated_bytes.all.current", "reserved_bytes.all.peak", "num_ooms", "allocation.all.allocated"):
        assert key in stats
    del x


def test_memory_stats_has_every_key_torch_cuda_documents():
    # num_device_alloc, num_device_free, max_split_size, num_sync_all_streams and the oversize
    # counters were missing (KeyError where torch.cuda.memory_stats has them), and the device
    # allocation counts were never kept.
    torch.neuron.empty_cache()
    torch.neuron.reset_accumulated_memory_stats()
    x = torch.empty(3 * MiB, dtype=torch.uint8, device="neuron")
    stats = torch.neuron.memory_stats()
    assert stats == dict(torch.accelerator.memory_stats(0))
    for key in ("num_device_alloc", "num_device_free", "max_split_size", "num_sync_all_streams",
                "oversize_allocations.current", "oversize_segments.peak"):
        assert key in stats
    assert stats["num_device_alloc"] == stats["segment.all.allocated"] >= 1
    del x
    torch.neuron.empty_cache()
    stats = torch.neuron.memory_stats()
    assert stats["num_device_free"] == stats["segment.all.freed"] >= 1
    torch.neuron.reset_accumulated_memory_stats()
    assert torch.neuron.memory_stats()["num_device_alloc"] == 0


def test_caching_allocator_alloc_and_delete_as_torch_cuda():
    # torch.cuda's raw-block API for other frameworks: an AttributeError on neuron before.
    base = torch.neuron.memory_allocated(1)
    stream = torch.neuron.Stream(device=1)
    address = torch.neuron.caching_allocator_alloc(3 * MiB, device=1, stream=stream)
    assert address != 0 and torch.neuron.memory_allocated(1) == base + 3 * MiB
    assert torch.neuron.current_device() == 0
    torch.neuron.caching_allocator_delete(address)
    assert torch.neuron.memory_allocated(1) == base
    with pytest.raises(RuntimeError, match="invalid device pointer"):
        torch.neuron.caching_allocator_delete(address)
    with pytest.raises(TypeError, match="expected a torch.neuron.Stream"):
        torch.neuron.caching_allocator_alloc(16, stream=1234)
    with pytest.raises(ValueError, match="stream is on neuron:1"):
        torch.neuron.caching_allocator_alloc(16, device=0, stream=stream)
    with pytest.raises(torch.OutOfMemoryError):
        torch.neuron.caching_allocator_alloc(1 << 50)
    assert torch.neuron.caching_allocator_alloc(0) == 0
    torch.neuron.caching_allocator_delete(0)


def test_deprecated_cached_names_and_allocator_backend_as_torch_cuda():
    assert torch.neuron.memory_cached() == torch.neuron.memory_reserved()
    with pytest.warns(FutureWarning, match="max_memory_reserved"):
        assert torch.neuron.max_memory_cached() == torch.neuron.max_memory_reserved()
    with pytest.warns(FutureWarning, match="reset_peak_memory_stats"):
        torch.neuron.reset_max_memory_cached()
    assert torch.neuron.get_allocator_backend() == "native"


def test_mem_get_info_reports_capacity():
    free, total = torch.neuron.mem_get_info(0)
    assert total == 24 * 2**30 and 0 < free <= total


def test_memory_summary_mentions_core():
    assert "neuron:0" in torch.neuron.memory_summary()


def test_out_of_memory_error_and_recovery():
    torch.neuron.reset_accumulated_memory_stats()
    with pytest.raises(torch.OutOfMemoryError) as info:
        torch.empty(30 * 2**30, dtype=torch.uint8, device="neuron")
    message = str(info.value)
    assert "Tried to allocate 30.00 GiB" in message and "total capacity of 24.00 GiB" in message
    assert torch.neuron.memory_stats()["num_ooms"] == 1
    # The process keeps working.
    assert (torch.ones(3, device="neuron") + 1).cpu().eq(2).all()


def test_oom_after_filling_the_core_then_freeing(python_in_subprocess):
    result = python_in_subprocess(
        """
        import torch
        blocks = [torch.empty(64 << 20, dtype=torch.uint8, device="neuron") for _ in range(4)]
        try:
            torch.empty(64 << 20, dtype=torch.uint8, device="neuron")
        except torch.OutOfMemoryError as e:
            print("OOM", "Tried to allocate 64.00 MiB" in str(e))
        del blocks
        x = torch.empty(200 << 20, dtype=torch.uint8, device="neuron")  # cache released and retried
        print("OK", torch.neuron.memory_stats()["num_alloc_retries"] >= 1)
        """,
        env={"NEURON_EMU_HBM_GIB": "0.25"},
    )
    assert result.returncode == 0, result.stderr
    assert "OOM True" in result.stdout and "OK True" in result.stdout


def test_a_segment_larger_than_the_hosts_free_ram_is_an_oom_not_a_killed_process(python_in_subprocess):
    """Emulated HBM is host RAM: a core configured larger than the machine must not hand out
    memory the host cannot back (the kernel would kill the process once it is written)."""
    result = python_in_subprocess(
        """
        import torch
        available = int(open("/proc/meminfo").read().split("MemAvailable:")[1].split()[0]) * 1024
        try:
            torch.empty(available + (256 << 20), dtype=torch.uint8, device="neuron")
            print("ALLOCATED")
        except torch.OutOfMemoryError as e:
            print("OOM", "of RAM left" in str(e) and "NEURON_EMU_HBM_GIB" in str(e))
        x = torch.ones(1 << 20, device="neuron")  # the allocator still works
        print("OK", x.sum().item() == float(1 << 20), torch.neuron.memory_stats()["num_ooms"])
        """,
        env={"NEURON_EMU_HBM_GIB": "100000"},
    )
    assert result.returncode == 0, result.stderr
    assert "OOM True" in result.stdout and "OK True 1" in result.stdout, result.stdout


def test_pin_memory_and_non_blocking_copy():
    x = torch.randn(16).pin_memory()
    assert x.is_pinned()
    y = x.to("neuron", non_blocking=True)
    torch.neuron.synchronize()
    assert y.cpu().equal(x)
    z = y.to("cpu", non_blocking=True)
    assert z.equal(x)


def test_device_factories_refuse_pin_memory_as_cuda_does():
    # pin_memory=True was silently ignored for tensors made on neuron; CUDA refuses it.
    for make in (lambda: torch.empty(2, device="neuron", pin_memory=True),
                 lambda: torch.zeros(2, device="neuron", pin_memory=True),
                 lambda: torch.empty_strided((2,), (1,), device="neuron", pin_memory=True),
                 lambda: torch.empty_like(torch.ones(2, device="neuron"), pin_memory=True)):
        with pytest.raises(RuntimeError, match="Only dense CPU tensors can be pinned"):
            make()
    assert torch.empty(2, device="neuron", pin_memory=False).device.type == "neuron"
    # As on CUDA: torch.tensor stages the data in pinned host memory, then copies it over.
    assert torch.tensor([1.0], device="neuron", pin_memory=True).cpu().item() == 1.0


def test_per_process_memory_fraction_caps_the_core(python_in_subprocess):
    # 1 GiB core, fraction 0.25: a 200 MiB tensor fits, a second one does not (as on CUDA).
    result = python_in_subprocess(
        """
        import torch
        assert torch.neuron.get_per_process_memory_fraction() == 1.0
        torch.neuron.set_per_process_memory_fraction(0.25)
        assert torch.neuron.get_per_process_memory_fraction(0) == 0.25
        assert torch.neuron.get_per_process_memory_fraction(1) == 1.0  # per core
        a = torch.empty(200 << 20, dtype=torch.uint8, device="neuron")
        try:
            torch.empty(200 << 20, dtype=torch.uint8, device="neuron")
            print("NO OOM")
        except torch.OutOfMemoryError as e:
            print("OOM", "set_per_process_memory_fraction" in str(e), "0.25" in str(e))
        b = torch.empty(200 << 20, dtype=torch.uint8, device="neuron:1")  # other core: no cap
        torch.neuron.set_per_process_memory_fraction(1.0)
        c = torch.empty(200 << 20, dtype=torch.uint8, device="neuron")
        print("LIFTED", torch.neuron.memory_allocated(0) >= (400 << 20))
        """,
        env={"NEURON_EMU_HBM_GIB": "1"},
    )
    assert result.returncode == 0, result.stderr
    assert "OOM True True" in result.stdout and "LIFTED True" in result.stdout


@pytest.mark.parametrize("bad, error", [(1.5, ValueError), (-0.1, ValueError), ("half", TypeError)])
def test_per_process_memory_fraction_rejects_bad_values(bad, error):
    with pytest.raises(error, match="fraction"):
        torch.neuron.set_per_process_memory_fraction(bad)
    assert torch.neuron.get_per_process_memory_fraction() == 1.0


def test_memory_fraction_of_an_invalid_core_names_the_index():
    with pytest.raises(RuntimeError, match="Invalid device index neuron:99"):
        torch.neuron.set_per_process_memory_fraction(0.5, 99)


def test_memory_snapshot_lists_live_and_cached_segments():
    torch.neuron.empty_cache()
    live = torch.empty(3 * MiB, dtype=torch.uint8, device="neuron:1")
    cached = torch.empty(5 * MiB, dtype=torch.uint8, device="neuron:1")
    cached_address = cached.data_ptr()
    del cached
    segments = {s["address"]: s for s in torch.neuron.memory_snapshot() if s["device"] == 1}
    entry = segments[live.data_ptr()]
    assert entry["total_size"] >= 3 * MiB and entry["requested_size"] == 3 * MiB
    assert entry["segment_type"] == "large" and entry["blocks"][0]["state"] == "active_allocated"
    assert segments[cached_address]["blocks"][0]["state"] == "inactive"
    assert segments[cached_address]["allocated_size"] == 0
    total = sum(s["total_size"] for s in torch.neuron.memory_snapshot() if s["device"] == 1)
    assert total == torch.neuron.memory_reserved(1)


def test_memory_snapshot_agrees_with_memory_stats():
    # The snapshot showed a live 4 MiB segment as one allocated block, where the statistics
    # count the request rounded to 512 B as allocated and the rest as an inactive split (as
    # CUDA's allocator splits it off); on CUDA both come from the same blocks.
    torch.neuron.empty_cache()
    live = torch.empty(10**6, device="neuron:2")
    stats = torch.neuron.memory_stats(2)
    segments = [s for s in torch.neuron.memory_snapshot() if s["device"] == 2]
    blocks = [b for s in segments for b in s["blocks"]]
    assert sum(s["allocated_size"] for s in segments) == stats["allocated_bytes.all.current"] == 4000256
    assert sum(b["size"] for b in blocks if b["state"] == "active_allocated") == 4000256
    split = [b for s in segments if s["allocated_size"] for b in s["blocks"] if b["state"] == "inactive"]
    assert [b["size"] for b in split] == [stats["inactive_split_bytes.all.current"]] == [194048]
    assert split[0]["address"] == live.data_ptr() + 4000256
    assert sum(b["size"] for b in blocks) == sum(s["total_size"] for s in segments)


def test_host_memory_stats_and_empty_host_cache():
    # torch.accelerator.empty_host_cache() reached a null host allocator and crashed the process.
    torch.ones(1, device="neuron")
    torch.neuron.reset_peak_host_memory_stats()
    before = torch.neuron.host_memory_stats()
    pinned = torch.empty(MiB, dtype=torch.uint8).pin_memory()
    stats = torch.neuron.host_memory_stats()
    assert stats["active_bytes.current"] == before["active_bytes.current"] + MiB
    assert stats["num_host_alloc"] == before["num_host_alloc"] + 1
    del pinned
    assert torch.neuron.host_memory_stats()["active_bytes.current"] == before["active_bytes.current"]
    assert torch.neuron.host_memory_stats()["active_bytes.peak"] >= MiB
    torch.accelerator.empty_host_cache()


def test_accelerator_device_capability_lists_the_dtypes():
    dtypes = torch.accelerator.get_device_capability("neuron:0")["supported_dtypes"]
    assert {torch.float32, torch.bfloat16, torch.float16, torch.int64, torch.bool} <= set(dtypes)
    assert torch.qint8 not in dtypes  # quantized tensors are refused on neuron
    # The documented contract: every listed dtype can be allocated and converted to the others.
    for dtype in dtypes:
        x = torch.zeros(2, dtype=dtype, device="neuron")
        assert x.to(torch.float32).to(dtype).dtype == dtype
        assert torch.zeros(2, device="neuron").to(dtype).dtype == dtype
    with pytest.raises(RuntimeError, match="Invalid device index"):
        torch._C._accelerator_getDeviceCapability(42)


def test_device_capability_follows_the_float64_policy(python_in_subprocess):
    result = python_in_subprocess(
        """
        import torch
        dtypes = torch.accelerator.get_device_capability(0)["supported_dtypes"]
        print(torch.float64 in dtypes, torch.float32 in dtypes)
        """,
        env={"NEURON_EMU_FLOAT64": "error"},
    )
    assert result.returncode == 0, result.stderr
    assert "False True" in result.stdout


def test_runtime_empty_strided_entry_point_for_compiled_programs():
    """``_C._empty_strided``: torch.empty_strided on the current core without the argument parser."""
    from neuron_runtime import _C

    previous = torch.neuron.current_device()
    try:
        torch.neuron.set_device(1)
        t = _C._empty_strided((4, 6), (1, 4), torch.bfloat16)
        assert (t.device, t.shape, t.stride(), t.dtype) == (torch.device("neuron", 1), (4, 6), (1, 4), torch.bfloat16)
        assert not t.requires_grad
    finally:
        torch.neuron.set_device(previous)
    with pytest.raises(torch.OutOfMemoryError, match="NEURON out of memory"):
        _C._empty_strided((1 << 40,), (1,), torch.float32)
    with pytest.raises(RuntimeError, match="size has 2 dimensions but stride has 1"):
        _C._empty_strided((2, 3), (1,), torch.float32)
    with pytest.raises(RuntimeError, match="size must be a tuple or list of ints"):
        _C._empty_strided(5, (1,), torch.float32)


def test_runtime_empty_strided_fills_under_deterministic_mode():
    from neuron_runtime import _C

    torch.use_deterministic_algorithms(True)
    try:
        assert torch.isnan(_C._empty_strided((8,), (1,), torch.float32).cpu()).all()
    finally:
        torch.use_deterministic_algorithms(False)


def _allocate_for_history(numel: int) -> torch.Tensor:
    return torch.empty(numel, device="neuron:3")


def test_record_memory_history_as_torch_cuda(tmp_path):
    # torch.cuda.memory's OOM-debugging workflow: record, reproduce, dump, open in memory_viz.
    # There was no history on neuron: _snapshot() returned the segments and no device_traces.
    import pickle

    from torch.cuda import _memory_viz

    torch.neuron.empty_cache()
    torch.neuron.memory._record_memory_history(max_entries=1000, stacks="python", clear_history=True)
    try:
        kept = _allocate_for_history(10**6)
        freed = _allocate_for_history(3 * 10**5)
        freed_address = freed.data_ptr()
        del freed
        with pytest.raises(torch.OutOfMemoryError):
            _allocate_for_history(1 << 40)
        path = tmp_path / "snapshot.pickle"
        torch.neuron.memory._dump_snapshot(str(path))
    finally:
        torch.neuron.memory._record_memory_history(None)
    with open(path, "rb") as f:
        snapshot = pickle.load(f)
    trace = snapshot["device_traces"][3]
    actions = [entry["action"] for entry in trace]
    # Before giving up, the allocator returns its cached segment to the host (as CUDA's does).
    assert actions == ["segment_alloc", "alloc", "segment_alloc", "alloc", "free_requested",
                       "free_completed", "segment_free", "oom", "snapshot"]
    assert [e["size"] for e in trace if e["action"] == "alloc"] == [4000256, 1200128]
    assert [e["addr"] for e in trace if e["action"].startswith("free")] == [freed_address] * 2
    oom = trace[actions.index("oom")]
    assert oom["size"] == 4 << 40 and 0 < oom["device_free"] <= 24 << 30
    # Each action carries the Python stack that caused it.
    for entry in trace:
        if entry["action"] in ("segment_free", "snapshot"):
            continue
        names = [frame["name"] for frame in entry["frames"]]
        assert "_allocate_for_history" in names or "test_record_memory_history_as_torch_cuda" in names, names
    live = [s for s in snapshot["segments"] if s["device"] == 3 and s["address"] == kept.data_ptr()]
    assert "_allocate_for_history" in [frame["name"] for frame in live[0]["blocks"][0]["frames"]]
    assert _memory_viz.trace_plot(snapshot) and _memory_viz.segment_plot(snapshot)
    # Stopping drops the history; stacks of later allocations are not kept.
    assert torch.neuron.memory._snapshot()["device_traces"][3] == []
    later = _allocate_for_history(10)
    segments = torch.neuron.memory_snapshot()
    assert [s["blocks"][0]["frames"] for s in segments if s["address"] == later.data_ptr()] in ([[]], [])


def test_record_memory_history_bounds_and_skips_entries():
    torch.neuron.memory._record_memory_history(max_entries=3, skip_actions=["segment_alloc"],
                                                stacks="python", clear_history=True)
    try:
        for _ in range(5):
            _allocate_for_history(64)
        trace = torch.neuron.memory._snapshot()["device_traces"][3]
    finally:
        torch.neuron.memory._record_memory_history(None)
    assert len(trace) == 3 and "segment_alloc" not in [e["action"] for e in trace]
    assert trace[-1]["action"] == "snapshot"


def test_record_memory_history_takes_torch_cudas_legacy_arguments():
    torch.neuron.memory._record_memory_history(True, trace_alloc_max_entries=10, trace_alloc_record_context=True)
    try:
        kept = _allocate_for_history(64)
        trace = torch.neuron.memory._snapshot()["device_traces"][3]
    finally:
        torch.neuron.memory._record_memory_history(False)
    allocs = [e for e in trace if e["action"] == "alloc" and e["addr"] == kept.data_ptr()]
    assert len(allocs) == 1 and "_allocate_for_history" in [f["name"] for f in allocs[0]["frames"]]
    assert torch.neuron.memory._snapshot()["device_traces"][3] == []
    with pytest.raises(TypeError, match="unexpected keyword arguments"):
        torch.neuron.memory._record_memory_history(True, no_such_option=1)


@pytest.mark.parametrize("kwargs, message", [
    ({"enabled": "everything"}, "enabled must be None, 'state' or 'all'"),
    ({"context": "some"}, "context must be None"),
    ({"stacks": "cpp"}, "stacks must be 'python' or 'all'"),
    ({"skip_actions": ["allocate"]}, "Unknown action in skip_actions: 'allocate'"),
])
def test_record_memory_history_refuses_bad_arguments(kwargs, message):
    with pytest.raises(ValueError, match=message):
        torch.neuron.memory._record_memory_history(**kwargs)
    assert torch.neuron.memory._snapshot()["device_traces"][3] == []
