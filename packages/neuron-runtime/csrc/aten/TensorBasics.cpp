// The minimum set of neuron kernels that make tensors exist: allocation, views, resizing,
// storage swaps, copies between devices and reading a scalar back. Everything else runs
// through the zero-copy fallback.
#include "aten/TensorBasics.h"

#include "aten/HostViews.h"
#include "aten/OpAccounting.h"
#include "driver/DeviceState.h"
#include "runtime/NeuronCachingAllocator.h"

#include <ATen/EmptyTensor.h>
#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/native/Resize.h>
#include <ATen/native/TensorFactories.h>
#include <ATen/ops/_local_scalar_dense.h>
#include <ATen/ops/_reshape_alias_native.h>
#include <ATen/ops/as_strided_native.h>
#include <ATen/ops/resize_native.h>
#include <ATen/ops/set_native.h>
#include <ATen/ops/view_native.h>
#include <c10/core/DeviceGuard.h>
#include <torch/library.h>

#include <cstring>

namespace neuron {
namespace {

c10::Device neuronDevice(std::optional<c10::Device> device) {
  lazyInitDevice();
  const auto index = device && device->has_index() ? device->index() : currentDevice();
  checkDeviceIndex(index);
  return {c10::DeviceType::PrivateUse1, index};
}

// torch.use_deterministic_algorithms(True) fills new memory with NaN (or the dtype's maximum),
// as the CPU and CUDA factories do, so uninitialised reads are reproducible.
at::Tensor fillIfDeterministic(at::Tensor tensor) {
  auto& context = at::globalContext();
  if (C10_UNLIKELY(context.deterministicAlgorithms() &&
                   context.deterministicFillUninitializedMemory())) {
    at::native::fill_empty_deterministic_(tensor);
  }
  return tensor;
}

// Pinning is a property of host memory: a device allocation asking for it is refused, as
// CUDA's empty_cuda does, rather than silently ignored.
void checkNotPinned(std::optional<bool> pin_memory) {
  TORCH_CHECK(!pin_memory.value_or(false),
              "Only dense CPU tensors can be pinned. Drop pin_memory=True for tensors created on "
              "neuron, or create the tensor on the CPU with pin_memory=True and copy it with "
              ".to(\"neuron\", non_blocking=True).");
}

at::Tensor empty_memory_format(c10::IntArrayRef size, std::optional<c10::ScalarType> dtype,
                               std::optional<c10::Layout> layout,
                               std::optional<c10::Device> device,
                               std::optional<bool> pin_memory,
                               std::optional<c10::MemoryFormat> memory_format) {
  checkNotPinned(pin_memory);
  TORCH_CHECK(!layout || *layout == c10::kStrided,
              "neuron supports strided (dense) tensors only, not layout ", *layout);
  const c10::Device where = neuronDevice(device);
  const auto scalar_type = c10::dtype_or_default(dtype);
  checkFloat64("aten::empty", scalar_type);
  c10::DeviceGuard guard(where);
  return fillIfDeterministic(at::detail::empty_generic(
      size, &cachingAllocator(), c10::DispatchKeySet(c10::DispatchKey::PrivateUse1), scalar_type,
      memory_format));
}

at::Tensor empty_strided(c10::IntArrayRef size, c10::IntArrayRef stride,
                         std::optional<c10::ScalarType> dtype, std::optional<c10::Layout> layout,
                         std::optional<c10::Device> device, std::optional<bool> pin_memory) {
  checkNotPinned(pin_memory);
  TORCH_CHECK(!layout || *layout == c10::kStrided,
              "neuron supports strided (dense) tensors only, not layout ", *layout);
  const c10::Device where = neuronDevice(device);
  const auto scalar_type = c10::dtype_or_default(dtype);
  checkFloat64("aten::empty_strided", scalar_type);
  c10::DeviceGuard guard(where);
  return fillIfDeterministic(at::detail::empty_strided_generic(
      size, stride, &cachingAllocator(), c10::DispatchKeySet(c10::DispatchKey::PrivateUse1),
      scalar_type));
}

at::Tensor as_strided(const at::Tensor& self, c10::IntArrayRef size, c10::IntArrayRef stride,
                      std::optional<int64_t> storage_offset) {
  return at::native::as_strided_tensorimpl(self, size, stride, storage_offset);
}

at::Tensor view(const at::Tensor& self, c10::IntArrayRef size) {
  return at::native::view(self, size);
}

at::Tensor reshape_alias(const at::Tensor& self, c10::IntArrayRef size, c10::IntArrayRef stride) {
  return at::native::_reshape_alias(self, size, stride);
}

// Resizing reallocates through the storage's allocator (ours) on the tensor's own core.
const at::Tensor& resize_(const at::Tensor& self, c10::IntArrayRef size,
                          std::optional<c10::MemoryFormat> memory_format) {
  c10::DeviceGuard guard(self.device());
  return at::native::resize_(self, size, memory_format);
}

at::Tensor& set_source_storage_offset(at::Tensor& self, c10::Storage source, int64_t offset,
                                      c10::IntArrayRef size, c10::IntArrayRef stride) {
  TORCH_CHECK(source.device() == self.device(),
              "Attempted to set the storage of a tensor on device \"", self.device(),
              "\" to a storage on different device \"", source.device(),
              "\". This is no longer allowed; the devices must match.");
  c10::DeviceGuard guard(self.device());
  return at::native::set_storage_cpu_(self, std::move(source), offset, size, stride);
}

at::Tensor& set_source_storage(at::Tensor& self, c10::Storage source) {
  const int64_t numel = static_cast<int64_t>(source.nbytes() / self.dtype().itemsize());
  return set_source_storage_offset(self, std::move(source), 0, {numel}, {});
}

at::Tensor& set_empty(at::Tensor& self) {
  c10::Storage storage(c10::Storage::use_byte_size_t(), 0,
                       cachingAllocator().allocateOn(0, self.device().index()),
                       &cachingAllocator(), /*resizable=*/true);
  return set_source_storage_offset(self, std::move(storage), 0, {0}, {});
}

// Copies between neuron and the CPU (or two cores) are host memcpys through CPU views.
at::Tensor copy_from(const at::Tensor& self, const at::Tensor& dst, bool /*non_blocking*/) {
  TORCH_CHECK(self.is_privateuseone() || self.is_cpu(),
              "neuron: cannot copy from a ", self.device(), " tensor to ", dst.device(),
              "; move it to the CPU first.");
  TORCH_CHECK(dst.is_privateuseone() || dst.is_cpu(),
              "neuron: cannot copy to a ", dst.device(), " tensor from ", self.device(),
              "; move it to the CPU first.");
  if (dst.is_privateuseone()) checkFloat64("aten::copy_", dst.scalar_type());
  // Views of one storage take ATen's copy on views sharing a CPU storage: it skips a copy
  // onto the same elements and refuses partial overlap, as on the CPU.
  const bool same_storage = self.is_privateuseone() && dst.is_privateuseone() &&
                            self.storage().unsafeGetStorageImpl() == dst.storage().unsafeGetStorageImpl();
  if (!same_storage && self.dtype() == dst.dtype() && self.sizes() == dst.sizes() &&
      self.numel() < at::internal::GRAIN_SIZE && self.is_contiguous() && dst.is_contiguous() &&
      !self.is_conj() && !dst.is_conj() && !self.is_neg() && !dst.is_neg()) {
    // Small, same layout and type: one memcpy (device memory is host memory). Larger
    // copies take ATen's copy, which splits the work across threads.
    if (self.numel() > 0 && self.data_ptr() != dst.data_ptr()) {
      std::memmove(dst.data_ptr(), self.data_ptr(), self.nbytes());
    }
    return dst;
  }
  HostViewSet views;
  at::Tensor dst_view = dst.is_privateuseone() ? views.viewOf(dst) : dst;
  dst_view.copy_(self.is_privateuseone() ? views.viewOf(self) : self);
  return dst;
}

at::Tensor copy_from_and_resize(const at::Tensor& self, const at::Tensor& dst) {
  if (dst.sizes() != self.sizes()) {
    if (dst.is_privateuseone()) {
      resize_(dst, self.sizes(), std::nullopt);
    } else {
      dst.resize_(self.sizes());
    }
  }
  return copy_from(self, dst, false);
}

c10::Scalar local_scalar_dense(const at::Tensor& self) {
  return at::_local_scalar_dense(hostView(self));
}

// A tensor of zeros with no memory (what autograd uses for known-zero gradients); the
// ZeroTensor key makes every op see it as zeros before it reaches a kernel.
struct ZeroTensorAllocator final : c10::Allocator {
  explicit ZeroTensorAllocator(c10::Device device) : device_(device) {}
  c10::DataPtr allocate(size_t /*nbytes*/) override { return {nullptr, nullptr, &noop, device_}; }
  c10::DeleterFnPtr raw_deleter() const override { return &noop; }
  void copy_data(void* /*dest*/, const void* /*src*/, std::size_t /*count*/) const override {}
  static void noop(void* /*ptr*/) {}
  c10::Device device_;
};

at::Tensor efficientzerotensor(c10::IntArrayRef size, std::optional<c10::ScalarType> dtype,
                               std::optional<c10::Layout> /*layout*/,
                               std::optional<c10::Device> device,
                               std::optional<bool> /*pin_memory*/) {
  ZeroTensorAllocator allocator(neuronDevice(device));
  const auto keys = c10::DispatchKeySet(c10::DispatchKey::PrivateUse1) |
                    c10::DispatchKeySet(c10::DispatchKey::ZeroTensor);
  return at::detail::empty_generic(size, &allocator, keys, c10::dtype_or_default(dtype),
                                   std::nullopt);
}

// Lets Module.to("neuron") swap parameter data in place, keeping tied weights tied, as it
// does between the CPU and CUDA (c10's dense-backend list does not include PrivateUse1).
bool has_compatible_shallow_copy_type(const at::Tensor& self, const at::Tensor& from) {
  const auto dense = [](const at::Tensor& t) {
    return t.layout() == c10::kStrided && (t.is_cpu() || t.is_privateuseone() || t.is_cuda());
  };
  if (dense(self) && dense(from)) return true;
  return self.unsafeGetTensorImpl()->has_compatible_shallow_copy_type(from.key_set());
}

}  // namespace

at::Tensor emptyStridedOnCurrentCore(c10::IntArrayRef size, c10::IntArrayRef stride, c10::ScalarType dtype) {
  return empty_strided(size, stride, dtype, std::nullopt, std::nullopt, std::nullopt);
}

TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {
  m.impl("empty.memory_format", empty_memory_format);
  m.impl("empty_strided", empty_strided);
  m.impl("as_strided", as_strided);
  m.impl("view", view);
  m.impl("_reshape_alias", reshape_alias);
  m.impl("resize_", resize_);
  m.impl("set_.source_Storage", set_source_storage);
  m.impl("set_.source_Storage_storage_offset", set_source_storage_offset);
  m.impl("set_", set_empty);
  m.impl("_copy_from", copy_from);
  m.impl("_copy_from_and_resize", copy_from_and_resize);
  m.impl("_local_scalar_dense", local_scalar_dense);
  m.impl("_efficientzerotensor", efficientzerotensor);
}

// Copies handle conjugate and negative views themselves (the CPU copy they run resolves
// the bits); without this, the Conjugate fallback would materialise the source with a
// copy, which calls _copy_from again, forever.
TORCH_LIBRARY_IMPL(aten, Conjugate, m) {
  m.impl("_copy_from", torch::CppFunction::makeFallthrough());
  m.impl("_copy_from_and_resize", torch::CppFunction::makeFallthrough());
}

TORCH_LIBRARY_IMPL(aten, Negative, m) {
  m.impl("_copy_from", torch::CppFunction::makeFallthrough());
  m.impl("_copy_from_and_resize", torch::CppFunction::makeFallthrough());
}

// Registered for both backends a parameter moves between; a kernel for the backend key
// takes precedence over the CompositeImplicitAutograd default.
TORCH_LIBRARY_IMPL(aten, CPU, m) {
  m.impl("_has_compatible_shallow_copy_type", has_compatible_shallow_copy_type);
}

TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {
  m.impl("_has_compatible_shallow_copy_type", has_compatible_shallow_copy_type);
}

}  // namespace neuron
