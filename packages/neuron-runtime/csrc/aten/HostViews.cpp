// CPU views of neuron tensors, the redirecting CPU allocator, and adoption of CPU kernel
// outputs by the device. Nothing here copies tensor data except the counted last resort.
#include "aten/HostViews.h"

#include "aten/OpAccounting.h"
#include "runtime/NeuronCachingAllocator.h"

#include <ATen/ops/_efficientzerotensor.h>
#include <c10/core/CPUAllocator.h>
#include <c10/core/StorageImpl.h>
#include <c10/core/TensorImpl.h>
#include <c10/util/Exception.h>

#include <cstring>

namespace neuron {
namespace {

thread_local c10::DeviceIndex t_redirect_device = -1;
c10::Allocator* g_base_cpu_allocator = nullptr;

void deleteRawAny(void* ptr) {
  if (cachingAllocator().deviceOfPointer(ptr) >= 0) {
    deleteNeuronMemory(ptr);
  } else {
    g_base_cpu_allocator->raw_deleter()(ptr);
  }
}

// The process's CPU allocator once the runtime is loaded: plain CPU memory, except on a
// thread inside an AllocationRedirect, where it hands out neuron memory labelled as CPU.
class RedirectingCpuAllocator final : public c10::Allocator {
 public:
  c10::DataPtr allocate(size_t nbytes) override {
    if (t_redirect_device < 0) {
      return g_base_cpu_allocator->allocate(nbytes);
    }
    c10::DataPtr data = cachingAllocator().allocateOn(nbytes, t_redirect_device);
    data.unsafe_set_device(c10::Device(c10::DeviceType::CPU));
    return data;
  }
  c10::DeleterFnPtr raw_deleter() const override { return &deleteRawAny; }
  void copy_data(void* dest, const void* src, std::size_t count) const override {
    std::memcpy(dest, src, count);
  }
};

RedirectingCpuAllocator& redirectingAllocator() {
  static RedirectingCpuAllocator allocator;
  return allocator;
}

bool isNeuronMemory(const c10::DataPtr& data) {
  return data.get_deleter() == &deleteNeuronMemory;
}

c10::Storage emptyNeuronStorage(c10::DeviceIndex device) {
  return c10::Storage(c10::make_intrusive<c10::StorageImpl>(
      c10::StorageImpl::use_byte_size_t(), 0, cachingAllocator().allocateOn(0, device),
      &cachingAllocator(), /*resizable=*/true));
}

c10::Storage copyToNeuron(const c10::StorageImpl& source, c10::DeviceIndex device) {
  const size_t nbytes = source.nbytes();
  c10::DataPtr data = cachingAllocator().allocateOn(nbytes, device);
  std::memcpy(data.get(), source.data_ptr().get(), nbytes);
  return c10::Storage(c10::make_intrusive<c10::StorageImpl>(
      c10::StorageImpl::use_byte_size_t(), nbytes, std::move(data), &cachingAllocator(),
      /*resizable=*/true));
}

at::Tensor buildCpuView(const at::Tensor& tensor) {
  c10::StorageImpl* source = tensor.storage().unsafeGetStorageImpl();
  auto storage = c10::make_intrusive<c10::StorageImpl>(
      c10::StorageImpl::use_byte_size_t(), source->nbytes(),
      c10::DataPtr(source->data_ptr().get(), c10::Device(c10::DeviceType::CPU)),
      &redirectingAllocator(), source->resizable());
  return at::detail::make_tensor<c10::TensorImpl>(
      c10::Storage(std::move(storage)), c10::DispatchKeySet(c10::DispatchKey::CPU), tensor.dtype());
}

// Re-points a pooled view (held by nobody but the pool) at another tensor's bytes.
void retargetCpuView(const at::Tensor& view, const at::Tensor& tensor) {
  c10::StorageImpl* source = tensor.storage().unsafeGetStorageImpl();
  c10::StorageImpl* storage = view.storage().unsafeGetStorageImpl();
  storage->set_data_ptr_noswap(
      c10::DataPtr(source->data_ptr().get(), c10::Device(c10::DeviceType::CPU)));
  storage->set_nbytes(source->nbytes());
  storage->set_resizable(source->resizable());
  c10::TensorImpl* impl = view.unsafeGetTensorImpl();
  if (impl->dtype() != tensor.dtype()) {
    impl->set_storage_and_dtype(view.storage(), tensor.dtype());
  }
}

// CPU views are made for every tensor argument of every op; reusing the ones no kernel kept
// saves two allocations and two frees per argument.
class ViewPool {
 public:
  at::Tensor acquire(const at::Tensor& tensor) {
    for (size_t probe = 0; probe < views_.size(); ++probe) {
      at::Tensor& view = views_[next_];
      next_ = (next_ + 1) % views_.size();
      if (view.use_count() == 1 && view.storage().use_count() == 1 && !view.is_inference()) {
        retargetCpuView(view, tensor);
        return view;
      }
    }
    at::Tensor fresh = buildCpuView(tensor);
    if (views_.size() < kCapacity) views_.push_back(fresh);
    return fresh;
  }

 private:
  static constexpr size_t kCapacity = 16;
  c10::SmallVector<at::Tensor, kCapacity> views_;
  size_t next_ = 0;
};

void copyGeometry(const at::Tensor& view, const at::Tensor& tensor) {
  c10::TensorImpl* impl = view.unsafeGetTensorImpl();
  impl->set_sizes_and_strides(tensor.sizes(), tensor.strides(), tensor.storage_offset());
  impl->_set_conj(tensor.is_conj());
  impl->_set_neg(tensor.is_neg());
}

at::Tensor makeCpuView(const at::Tensor& tensor) {
  thread_local ViewPool pool;
  at::Tensor view = pool.acquire(tensor);
  copyGeometry(view, tensor);
  return view;
}

// A result whose shape reaches past its storage would be read out of bounds later: refuse
// it here, naming the op, instead of crashing then.
void checkFitsStorage(const at::Tensor& result, const c10::Storage& storage, const char* op_name) {
  if (result.numel() == 0) return;
  int64_t last = result.storage_offset();
  for (int64_t d = 0; d < result.dim(); ++d) {
    last += (result.size(d) - 1) * result.stride(d);
  }
  const size_t needed = static_cast<size_t>(last + 1) * result.dtype().itemsize();
  TORCH_CHECK(storage.nbytes() >= needed, "neuron: internal error: ", op_name,
              " produced a result of shape ", result.sizes(), " whose storage holds ",
              storage.nbytes(), " bytes but needs ", needed,
              ". Please report this with the op and its inputs.");
}

}  // namespace

AllocationRedirect::AllocationRedirect(c10::DeviceIndex device) : previous_(t_redirect_device) {
  t_redirect_device = device;
}

AllocationRedirect::~AllocationRedirect() {
  t_redirect_device = previous_;
}

void installAllocationRedirect() {
  if (g_base_cpu_allocator == nullptr) {
    g_base_cpu_allocator = c10::GetCPUAllocator();
    c10::SetCPUAllocator(&redirectingAllocator(), /*priority=*/1);
  }
}

at::Tensor hostView(const at::Tensor& tensor) {
  return tensor.is_privateuseone() ? makeCpuView(tensor) : tensor;
}

at::Tensor HostViewSet::viewOf(const at::Tensor& tensor) {
  c10::StorageImpl* neuron_storage = tensor.storage().unsafeGetStorageImpl();
  for (const auto& entry : entries_) {
    if (!entry.view.defined() || entry.neuron_storage.unsafeGetStorageImpl() != neuron_storage) {
      continue;
    }
    if (entry.source == tensor.unsafeGetTensorImpl()) return entry.view;
    // Another argument of this call views the same bytes: share its CPU storage.
    at::Tensor view = at::detail::make_tensor<c10::TensorImpl>(
        c10::Storage(entry.view.storage()), c10::DispatchKeySet(c10::DispatchKey::CPU), tensor.dtype());
    copyGeometry(view, tensor);
    entries_.push_back({entry.view_storage, tensor.storage(), tensor.unsafeGetTensorImpl(), view});
    return view;
  }
  at::Tensor view = makeCpuView(tensor);
  entries_.push_back({view.storage().unsafeGetStorageImpl(), tensor.storage(), tensor.unsafeGetTensorImpl(), view});
  return view;
}

c10::Storage HostViewSet::neuronStorageFor(const at::Tensor& cpu, c10::DeviceIndex device,
                                           const char* op_name) {
  c10::StorageImpl* impl = cpu.storage().unsafeGetStorageImpl();
  for (auto& entry : entries_) {
    if (entry.view_storage != impl) continue;
    c10::StorageImpl* target = entry.neuron_storage.unsafeGetStorageImpl();
    if (impl->data_ptr().get() != target->data_ptr().get()) {
      // The kernel resized an argument: its new bytes came through the redirect.
      if (isNeuronMemory(impl->data_ptr())) {
        c10::DataPtr moved = impl->set_data_ptr(
            c10::DataPtr(nullptr, c10::Device(c10::DeviceType::CPU)));
        moved.unsafe_set_device(target->device());
        target->set_data_ptr_noswap(std::move(moved));
      } else {
        recordCopyFallback(op_name);
        c10::Storage copy = copyToNeuron(*impl, target->device().index());
        target->set_data_ptr_noswap(std::move(copy.unsafeGetStorageImpl()->mutable_data_ptr()));
      }
      target->set_nbytes(impl->nbytes());
      impl->set_data_ptr_noswap(
          c10::DataPtr(target->data_ptr().get(), c10::Device(c10::DeviceType::CPU)));
    }
    return entry.neuron_storage;
  }
  if (impl->nbytes() == 0 || impl->data_ptr().get() == nullptr) {
    return emptyNeuronStorage(device);
  }
  if (isNeuronMemory(impl->data_ptr())) {
    // A fresh allocation made through the redirect: the device adopts it as is.
    if (!impl->device().is_privateuseone()) {
      impl->_mutable_data_ptr_no_checks().unsafe_set_device(
          c10::Device(c10::DeviceType::PrivateUse1, device));
      impl->set_allocator(&cachingAllocator());
    }
    return cpu.storage();
  }
  recordCopyFallback(op_name);
  c10::Storage copy = copyToNeuron(*impl, device);
  entries_.push_back({impl, copy, nullptr, at::Tensor()});
  return copy;
}

at::Tensor HostViewSet::toNeuron(at::Tensor cpu, c10::DeviceIndex device, const char* op_name) {
  if (!cpu.defined() || !cpu.is_cpu()) {
    return cpu;
  }
  TORCH_CHECK(cpu.layout() == c10::kStrided, "neuron: ", op_name, " produced a ", cpu.layout(),
              " tensor; the neuron device supports strided (dense) tensors only.");
  TORCH_CHECK_NOT_IMPLEMENTED(
      !cpu.is_nested(), "neuron: ", op_name,
      " produced a nested tensor, but the neuron device supports strided (dense) tensors only. Use "
      "torch.nested with layout=torch.jagged; nn.TransformerEncoder makes nested tensors in eval "
      "mode with a padding mask: pass enable_nested_tensor=False, or call "
      "torch.backends.mha.set_fastpath_enabled(False).");
  TORCH_CHECK_NOT_IMPLEMENTED(!cpu.is_quantized(), "neuron: ", op_name,
                              " produced a quantized tensor, but the neuron device supports strided (dense) "
                              "tensors only. Quantize on the CPU, or keep the tensor dequantized on neuron.");
  if (cpu._is_zerotensor()) {
    return at::_efficientzerotensor(cpu.sizes(), cpu.options().device(
                                                     c10::Device(c10::DeviceType::PrivateUse1, device)));
  }
  c10::Storage storage = neuronStorageFor(cpu, device, op_name);
  checkFitsStorage(cpu, storage, op_name);
  const c10::Device where(c10::DeviceType::PrivateUse1, device);
  if (cpu.use_count() == 1 && !cpu.is_inference()) {
    // Only the caller holds this result: turn it into a neuron tensor where it stands.
    c10::TensorImpl* impl = cpu.unsafeGetTensorImpl();
    impl->set_storage_keep_dtype(std::move(storage));
    impl->_change_backend_component_keys(where);
    return cpu;
  }
  auto result = at::detail::make_tensor<c10::TensorImpl>(
      std::move(storage), c10::DispatchKeySet(c10::DispatchKey::PrivateUse1), cpu.dtype());
  result.unsafeGetTensorImpl()->set_sizes_and_strides(cpu.sizes(), cpu.strides(),
                                                      cpu.storage_offset());
  if (cpu.is_conj()) result._set_conj(true);
  if (cpu.is_neg()) result._set_neg(true);
  return result;
}

void HostViewSet::syncBack(const at::Tensor& neuron_tensor, const at::Tensor& view,
                           const char* op_name) {
  c10::TensorImpl* impl = neuron_tensor.unsafeGetTensorImpl();
  c10::Storage storage = neuronStorageFor(view, neuron_tensor.device().index(), op_name);
  if (storage.unsafeGetStorageImpl() != impl->storage().unsafeGetStorageImpl()) {
    impl->set_storage_keep_dtype(std::move(storage));
  }
  if (impl->sizes() != view.sizes() || impl->strides() != view.strides() ||
      impl->storage_offset() != view.storage_offset()) {
    impl->set_sizes_and_strides(view.sizes(), view.strides(), view.storage_offset());
  }
}

}  // namespace neuron
