"""The ``torch-neuronx`` command: a short report of the emulated instance."""

from __future__ import annotations

import argparse


def main(argv: list[str] | None = None) -> int:
    """Prints the emulated instance, its cores and their memory."""
    parser = argparse.ArgumentParser(prog="torch-neuronx", description=__doc__)
    parser.add_argument("command", nargs="?", default="info", choices=["info"])
    parser.parse_args(argv)
    import torch

    import torch_neuronx  # noqa: F401

    if not torch.neuron.is_available():
        print("neuron: no emulated NeuronCores are visible")
        return 1
    props = torch.neuron.get_device_properties(0)
    print(f"instance: {props.instance} (LNC={props.logical_nc_config}), "
          f"{torch.neuron.device_count()} visible core(s) of {props.name}")
    for index in range(torch.neuron.device_count()):
        free, total = torch.neuron.mem_get_info(index)
        print(f"  neuron:{index}  HBM {total / 2**30:.1f} GiB, free {free / 2**30:.1f} GiB")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
