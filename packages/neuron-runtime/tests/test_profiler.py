"""PyTorch's profilers on neuron tensors: the kineto profiler and the legacy autograd profiler."""

from __future__ import annotations

import json


def test_legacy_autograd_profiler_records_device_times(python_in_subprocess):
    # torch.autograd.profiler.profile(use_device="neuron") asks the device's profiler stubs for
    # timestamps; without them every op raised inside the profiler (a C++ backtrace on stderr
    # per op) and the recorded times were uninitialised (negative totals).
    result = python_in_subprocess(
        """
        import json, torch
        from torch.autograd.profiler import profile
        x = torch.randn(64, 64, device="neuron")
        with profile(use_device="neuron") as prof:
            for _ in range(5):
                y = x @ x
        events = [e for e in prof.function_events if e.name == "aten::mm"]
        print(json.dumps({
            "mm": len(events),
            "cpu": [e.cpu_time_total for e in events],
            "device": [e.device_time_total for e in events],
            "negative": sum(e.cpu_time_total < 0 or e.device_time_total < 0 for e in prof.function_events),
        }))
        """
    )
    assert result.returncode == 0, result.stderr
    assert "Exception in RecordFunction callback" not in result.stderr
    report = json.loads(result.stdout.strip().splitlines()[-1])
    assert report["mm"] == 5
    assert report["negative"] == 0
    assert all(0 < t < 60e6 for t in report["cpu"])  # microseconds
    assert all(0 < t < 60e6 for t in report["device"])


def test_kineto_profiler_sees_neuron_ops():
    import torch
    from torch.profiler import ProfilerActivity, profile

    x = torch.randn(32, 32, device="neuron")
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        (x @ x).sum()
    names = {event.key for event in prof.key_averages()}
    assert {"aten::mm", "aten::sum"} <= names


def test_memory_profiling_records_device_allocations():
    # The allocator never reported to the profiler: with profile_memory=True, neuron memory was
    # invisible (no allocations per op, an empty memory timeline), where CUDA's is recorded.
    import torch
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.PrivateUse1], profile_memory=True) as prof:
        x = torch.empty(1024, 1024, device="neuron")  # 4 MiB
        y = x.add(1)
        del x, y
    by_op = {event.key: event for event in prof.key_averages()}
    assert by_op["aten::empty"].self_device_memory_usage == 4 << 20
    assert by_op["aten::empty"].self_cpu_memory_usage == 0
    assert by_op["aten::add"].device_memory_usage == 4 << 20
    frees = [e for e in prof.events() if e.name == "[memory]" and e.device_memory_usage == -(4 << 20)]
    assert len(frees) == 2
