// The emulated driver's notion of devices: how many there are, which one each thread is
// using, lazy initialisation and fork safety.
#pragma once

#include <c10/core/Device.h>

namespace neuron {

// Number of visible NeuronCores (0 when the configuration is invalid).
c10::DeviceIndex deviceCount() noexcept;

// Throws a clear error unless 0 <= index < deviceCount().
void checkDeviceIndex(c10::DeviceIndex index);

// The calling thread's current core; starts at the configured initial device (LOCAL_RANK).
c10::DeviceIndex currentDevice();
void setCurrentDevice(c10::DeviceIndex index);

// Lazily initialises the runtime: validates the configuration and refuses a forked
// child of an initialised parent. Cheap after the first call. Unless configured otherwise, the
// initialising thread then runs the backward work of neuron tensors itself instead of handing it
// to PyTorch's per-device autograd thread (autograd multithreading off for that thread).
void lazyInitDevice();
bool isInitialized() noexcept;

// True in a child forked after the parent initialised the runtime.
bool isInBadFork() noexcept;

}  // namespace neuron
