// The options a neuron backend reports (Backend::getBackendOptions, the `options` property).
#pragma once

#include <torch/csrc/distributed/c10d/Backend.hpp>

#include <chrono>
#include <string>
#include <utility>

namespace neuron_dist {

// torch's Backend::Options with copying: torch.distributed.split_group deep-copies the parent
// backend's `options` before splitting (as it does ProcessGroupGloo's and ProcessGroupNCCL's),
// and torch binds the base type without __deepcopy__.
struct BackendOptions : c10d::Backend::Options {
  explicit BackendOptions(std::string backend, std::chrono::milliseconds timeout)
      : Options(std::move(backend), timeout) {}
  BackendOptions(const BackendOptions&) = default;
};

} // namespace neuron_dist
