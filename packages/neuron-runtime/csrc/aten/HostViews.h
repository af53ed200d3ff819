// Zero-copy bridges between neuron tensors and the CPU tensors that ATen's CPU kernels
// operate on. Neuron memory is host memory, so a "CPU view" of a neuron tensor is a CPU
// tensor over the same bytes, and a CPU kernel's fresh output can be adopted by the device
// when its memory came from the neuron allocator (see AllocationRedirect).
#pragma once

#include "aten/OpAccounting.h"

#include <ATen/core/Tensor.h>
#include <c10/util/SmallVector.h>

namespace neuron {

// While alive on a thread, CPU allocations on that thread come from the neuron allocator
// (for `device`), so CPU kernels write their outputs straight into device memory.
class AllocationRedirect {
 public:
  explicit AllocationRedirect(c10::DeviceIndex device);
  ~AllocationRedirect();
  AllocationRedirect(const AllocationRedirect&) = delete;
  AllocationRedirect& operator=(const AllocationRedirect&) = delete;

 private:
  c10::DeviceIndex previous_;
};

// Runs `kernel` (a CPU kernel call on host views) with its allocations redirected to
// `device` and counts the op; returns the kernel's CPU result, for HostViewSet::toNeuron.
template <typename Kernel>
auto runOnDevice(c10::DeviceIndex device, const std::string& op_name, Kernel&& kernel) {
  auto result = [&] {
    AllocationRedirect redirect(device);
    return kernel();
  }();
  if (opMetricsEnabled()) recordZeroCopyOp(op_name);
  return result;
}

// Installs the redirecting CPU allocator (once, at load time).
void installAllocationRedirect();

// Tracks the CPU views created for one op call, so that results aliasing an input map back
// to that input's neuron storage, and resized out= arguments move their new memory over.
class HostViewSet {
 public:
  // A CPU tensor aliasing `tensor`'s bytes (same sizes, strides, offset, conj/neg bits).
  // Arguments sharing a neuron storage get views sharing one CPU storage, so the CPU
  // kernels' overlap checks (out= aliasing an input, partial-overlap copies) see them.
  at::Tensor viewOf(const at::Tensor& tensor);
  // The neuron tensor for a CPU result on `device`: aliases an input, adopts a fresh
  // neuron-backed allocation, or (last resort, counted) copies. A result nobody else holds
  // is converted in place (no new TensorImpl).
  at::Tensor toNeuron(at::Tensor cpu, c10::DeviceIndex device, const char* op_name);
  // After a kernel wrote to `view` (an out= or in-place argument), brings `neuron_tensor`'s
  // storage and geometry in line with it.
  void syncBack(const at::Tensor& neuron_tensor, const at::Tensor& view, const char* op_name);

 private:
  struct Entry {
    c10::StorageImpl* view_storage;
    c10::Storage neuron_storage;
    // Set for argument views (viewOf), not for copied results: the neuron tensor viewed and
    // its view, so a tensor passed twice (out= is an input) is one CPU tensor, as on the CPU.
    const c10::TensorImpl* source = nullptr;
    at::Tensor view;
  };
  c10::Storage neuronStorageFor(const at::Tensor& cpu, c10::DeviceIndex device, const char* op_name);
  c10::SmallVector<Entry, 4> entries_;
};

// Sends structured ATen ops straight to the zero-copy fallback (see ZeroCopyFallback.cpp).
void registerDirectFallbacks();

// One-off CPU view, for code paths that handle a single tensor (copy, item()).
at::Tensor hostView(const at::Tensor& tensor);

}  // namespace neuron
