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
