"""torch.save / torch.load with neuron tensors and map_location in both directions."""

from __future__ import annotations

import io
import subprocess
import sys
import textwrap

import torch


def _roundtrip(obj, **load_kwargs):
    buffer = io.BytesIO()
    torch.save(obj, buffer)
    buffer.seek(0)
    return torch.load(buffer, **load_kwargs)


def test_save_neuron_load_neuron():
    x = torch.randn(4, 3, device="neuron:1")
    y = _roundtrip(x)
    assert y.device == torch.device("neuron", 1) and y.cpu().equal(x.cpu())


def test_save_neuron_load_to_cpu():
    x = torch.randn(4, device="neuron")
    y = _roundtrip(x, map_location="cpu")
    assert y.device.type == "cpu" and y.equal(x.cpu())


def test_save_cpu_load_to_neuron():
    x = torch.randn(4)
    y = _roundtrip(x, map_location="neuron:2")
    assert y.device == torch.device("neuron", 2) and y.cpu().equal(x)


def test_optimizer_state_roundtrip():
    model = torch.nn.Linear(4, 2).to("neuron")
    opt = torch.optim.AdamW(model.parameters())
    model(torch.randn(3, 4, device="neuron")).sum().backward()
    opt.step()
    state = _roundtrip({"model": model.state_dict(), "opt": opt.state_dict()})
    assert state["opt"]["state"][0]["exp_avg"].device.type == "neuron"
    restored = torch.nn.Linear(4, 2).to("neuron")
    restored.load_state_dict(state["model"])
    assert restored.weight.cpu().equal(model.weight.cpu())


def test_neuron_tensor_through_a_multiprocessing_queue(tmp_path):
    # torch's reducer called a CPU-only sharing method in the queue's feeder thread: the item
    # was dropped and the receiving process waited forever. Neuron tensors now travel by value.
    script = tmp_path / "queue_roundtrip.py"
    script.write_text(textwrap.dedent(
        """
        import torch
        import torch.multiprocessing as mp

        def worker(inbox, outbox):
            x = inbox.get(timeout=60)
            outbox.put((x.device.type, x.device.index, (x * 2).cpu()))
            outbox.put(x + 1)
            inbox.get(timeout=60)  # as for CPU tensors: stay alive until the parent has them

        if __name__ == "__main__":
            ctx = mp.get_context("spawn")
            inbox, outbox = ctx.Queue(), ctx.Queue()
            child = ctx.Process(target=worker, args=(inbox, outbox))
            child.start()
            x = torch.arange(6.0, device="neuron:1").reshape(2, 3)[:, 1:]  # a strided view
            inbox.put(x)
            device_type, index, doubled = outbox.get(timeout=60)
            back = outbox.get(timeout=60)
            inbox.put("done")
            child.join(timeout=60)
            print(device_type, index, doubled.equal(x.cpu() * 2), back.device,
                  back.cpu().equal(x.cpu() + 1))
        """
    ))
    result = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=240)
    assert result.returncode == 0, result.stderr
    assert "neuron 1 True neuron:1 True" in result.stdout


def test_cpu_tensors_still_travel_through_shared_memory():
    import torch.multiprocessing as mp

    queue = mp.get_context("spawn").SimpleQueue()
    x = torch.arange(4.0)
    queue.put(x)
    received = queue.get()
    assert received.equal(x) and received.is_shared()


def test_neuron_tensor_as_an_argument_of_a_spawned_process(tmp_path):
    # The by-value host copy was freed once pickled, before the child started: the child got a
    # stale shared-memory descriptor and died unpickling ("unable to resize file").
    script = tmp_path / "spawn_argument.py"
    script.write_text(textwrap.dedent(
        """
        import torch
        import torch.multiprocessing as mp

        def worker(x, outbox):
            outbox.put((str(x.device), x.cpu().tolist()))

        if __name__ == "__main__":
            ctx = mp.get_context("spawn")
            outbox = ctx.Queue()
            x = torch.arange(8.0, device="neuron:1")
            child = ctx.Process(target=worker, args=(x, outbox))
            child.start()
            device, received = outbox.get(timeout=120)
            child.join(timeout=60)
            print(child.exitcode, device, received == x.cpu().tolist())
        """
    ))
    result = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=240)
    assert result.returncode == 0, result.stderr
    assert "0 neuron:1 True" in result.stdout
