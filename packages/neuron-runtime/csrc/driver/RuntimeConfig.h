// The emulated instance's configuration: set once from Python (which parses the
// environment), read everywhere else. A configuration error is kept, not thrown, so that
// `import torch` never fails; every use of the device then reports it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace neuron {

enum class Float64Policy : int8_t { kAllow = 0, kWarn = 1, kError = 2 };

struct RuntimeConfig {
  std::string instance = "trn2";          // instance profile name
  int64_t device_count = 0;               // visible (logical) NeuronCores
  int64_t capacity_bytes = 0;             // HBM per visible core
  int64_t initial_device = 0;             // LOCAL_RANK under torchrun, else 0
  Float64Policy float64 = Float64Policy::kWarn;
  bool backward_on_calling_thread = true;  // see lazyInitDevice (DeviceState.h)
  std::string error;                      // non-empty: the environment was invalid
};

// Installs the configuration. Called by the Python layer before any device use.
void setRuntimeConfig(RuntimeConfig config);

// The installed configuration (a default one with zero devices before setRuntimeConfig).
const RuntimeConfig& runtimeConfig();

// Throws the stored configuration error, if any, with an actionable message.
void checkRuntimeConfig();

}  // namespace neuron
