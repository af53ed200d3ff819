// How much memory the machine running the emulator can still provide. Emulated HBM is host
// RAM: a segment larger than what the host has left would be committed lazily and, once
// written, get the process killed by the kernel's OOM killer instead of raising
// torch.OutOfMemoryError. The allocator asks this before creating large segments.
#pragma once

#include <cstddef>

namespace neuron {

// Bytes available to this process: /proc/meminfo's MemAvailable, lowered to the headroom
// under a cgroup (v2) memory limit when there is one; SIZE_MAX when neither can be read.
size_t hostAvailableBytes();

}  // namespace neuron
