"""torch's "fake" process group (dry runs, PyTorch's LocalTensor tests) on neuron tensors."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

# One process simulates 4 ranks: FakeProcessGroup moves no data; LocalTensorMode holds one
# local tensor per rank. Each rank's shard of a random DTensor must equal the same op on a
# plain tensor after seeding that rank's generator alike (neuron meshes draw per shard).
_SCRIPT = textwrap.dedent(
    """
    import json
    import torch
    import torch.distributed as dist
    from torch.distributed._local_tensor import LocalTensorMode
    from torch.distributed.tensor import DTensor, Shard, init_device_mesh

    dist.init_process_group("fake", rank=0, world_size=4)
    result = {"backend": dist.get_backend()}
    flat = torch.ones(4, device="neuron")
    dist.all_reduce(flat)  # raised "No backend type associated with device type neuron"
    result["all_reduce_device"] = str(flat.device)
    with LocalTensorMode(frozenset(range(4))) as mode:
        mesh = init_device_mesh("neuron", (4,))
        local = torch.randn(8, 4, device="neuron")
        sharded = DTensor.from_local(local, mesh, [Shard(1)])
        expected = torch.clone(local)
        torch.manual_seed(5)
        expected = torch.nn.init.uniform_(expected, -1.0, 1.0)
        torch.manual_seed(5)
        sharded = torch.nn.init.uniform_(sharded, -1.0, 1.0)
        got = sharded.to_local()
        result["equal_per_rank"] = [bool(torch.equal(got._local_tensors[r], expected._local_tensors[r]))
                                    for r in range(4)]
        result["devices"] = sorted({t.device.type for t in got._local_tensors.values()})
        # the generator state round-trips while LocalTensor's dispatch modes are active
        state = torch.neuron.get_rng_state()
        torch.neuron.set_rng_state(state)
    dist.destroy_process_group()
    print(json.dumps(result))
    """
)


def test_fake_group_takes_neuron_tensors_and_local_tensor_random_ops() -> None:
    out = subprocess.run([sys.executable, "-c", _SCRIPT], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-4000:]
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert result == {"backend": "fake", "all_reduce_device": "neuron:0",
                      "equal_per_rank": [True] * 4, "devices": ["neuron"]}, result


# PyTorch's multi-threaded test group (FSDPTestMultiThread and friends): no neuron backend is
# created in the process, so DTensor's random module must be adapted when it is imported.
_THREADED_SCRIPT = textwrap.dedent(
    """
    import json, threading
    import torch
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Shard, distribute_tensor
    from torch.testing._internal.distributed.multi_threaded_pg import _install_threaded_pg

    torch._C._distributed_c10d._set_thread_isolation_mode(True)
    _install_threaded_pg()
    store = dist.HashStore()
    results, errors = {}, {}

    def run(rank):
        try:
            dist.init_process_group("threaded", rank=rank, world_size=2, store=store)
            mesh = init_device_mesh("neuron", (2,))
            weight = distribute_tensor(torch.zeros(8, 4, device="neuron"), mesh, [Shard(0)])
            torch.nn.init.uniform_(weight)
            results[rank] = [weight.to_local().device.type, bool(weight.to_local().abs().sum() > 0)]
        except BaseException as error:
            errors[rank] = repr(error)

    threads = [threading.Thread(target=run, args=(r,)) for r in range(2)]
    [t.start() for t in threads]
    [t.join() for t in threads]
    print(json.dumps({"results": results, "errors": errors}))
    """
)


def test_dtensor_random_ops_on_a_neuron_mesh_of_the_threaded_test_group() -> None:
    out = subprocess.run([sys.executable, "-c", _THREADED_SCRIPT], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-4000:]
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert result == {"results": {"0": ["neuron", True], "1": ["neuron", True]}, "errors": {}}, result
