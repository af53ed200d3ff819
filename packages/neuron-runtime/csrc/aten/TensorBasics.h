// Allocation entry points the runtime exposes outside the dispatcher.
#pragma once

#include <ATen/core/Tensor.h>

namespace neuron {

// What aten::empty_strided does on the current core (float64 policy, deterministic fill), without
// the dispatcher or Python's argument parser: the allocation of compiled programs.
at::Tensor emptyStridedOnCurrentCore(c10::IntArrayRef size, c10::IntArrayRef stride, c10::ScalarType dtype);

}  // namespace neuron
