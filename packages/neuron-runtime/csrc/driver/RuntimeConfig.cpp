// Storage for the emulated instance's configuration.
#include "driver/RuntimeConfig.h"

#include <c10/util/Exception.h>

#include <mutex>

namespace neuron {
namespace {
RuntimeConfig& mutableConfig() {
  static RuntimeConfig config;
  return config;
}
}  // namespace

void setRuntimeConfig(RuntimeConfig config) {
  mutableConfig() = std::move(config);
}

const RuntimeConfig& runtimeConfig() {
  return mutableConfig();
}

void checkRuntimeConfig() {
  const auto& config = mutableConfig();
  TORCH_CHECK(config.error.empty(), "neuron: ", config.error);
}

}  // namespace neuron
