// An unboxed torch.cat: the boxed fallback would pack the tensor list onto a stack, rebuild
// it with CPU views and unpack it again for the CPU kernel; this views each tensor once and
// calls ATen's CPU kernel directly.
#include "aten/HostViews.h"
#include "aten/OpAccounting.h"

#include <ATen/ops/cat_cpu_dispatch.h>
#include <c10/util/SmallVector.h>
#include <torch/library.h>

namespace neuron {
namespace {

at::Tensor cat(const at::ITensorListRef& tensors, int64_t dim) {
  constexpr const char* kName = "aten::cat";
  HostViewSet views;
  c10::SmallVector<at::Tensor, 8> host;
  std::optional<c10::Device> device;
  std::optional<c10::Device> other;
  for (const at::Tensor& tensor : tensors) {
    if (tensor.is_privateuseone()) {
      if (!device) device = tensor.device();
      if (tensor.device() != *device) other = tensor.device();
      checkFloat64(kName, tensor.scalar_type());
      host.push_back(views.viewOf(tensor));
    } else {
      other = tensor.device();
      host.push_back(tensor);
    }
  }
  TORCH_CHECK(device.has_value() && !other.has_value(),
              "Expected all tensors to be on the same device, but found at least two devices, ",
              device.value_or(c10::Device(c10::DeviceType::PrivateUse1)), " and ",
              other.value_or(c10::Device(c10::DeviceType::CPU)),
              "! (when checking argument 'tensors' of aten::cat)");
  return views.toNeuron(runOnDevice(device->index(), kName, [&] {
                          return at::cpu::cat(c10::ArrayRef<at::Tensor>(host.data(), host.size()), dim);
                        }),
                        device->index(), kName);
}

}  // namespace

TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {
  m.impl("cat", cat);
}

}  // namespace neuron
