// torch.histc on integer tensors, which CUDA supports (MoE routers count tokens per expert
// with it) but ATen's CPU kernel does not: counted in double on the host, returned in the
// input's dtype as CUDA does.
#include "aten/HostViews.h"

#include <ATen/ops/histc.h>
#include <c10/core/DeviceGuard.h>
#include <torch/library.h>

namespace neuron {
namespace {

at::Tensor histc(const at::Tensor& self, int64_t bins, const at::Scalar& min, const at::Scalar& max) {
  HostViewSet views;
  const auto device = self.device().index();
  at::Tensor host = views.viewOf(self);
  const char* name = "aten::histc";
  at::Tensor counts = runOnDevice(device, name, [&] {
    if (at::isIntegralType(self.scalar_type(), /*includeBool=*/false)) {
      return at::histc(host.to(at::kDouble), bins, min, max).to(self.scalar_type());
    }
    return at::histc(host, bins, min, max);
  });
  return views.toNeuron(std::move(counts), device, name);
}

}  // namespace

TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {
  m.impl("histc", histc);
}

}  // namespace neuron
