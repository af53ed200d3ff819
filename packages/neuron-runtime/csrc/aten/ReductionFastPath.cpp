// An unboxed torch.sum (the most common reduction: losses, norms, gradient checks): views the
// input once and calls ATen's CPU kernel directly, skipping the boxed fallback.
#include "aten/HostViews.h"
#include "aten/OpAccounting.h"

#include <ATen/ops/sum_cpu_dispatch.h>
#include <torch/library.h>

namespace neuron {
namespace {

at::Tensor sumOnHost(const at::Tensor& self, at::OptionalIntArrayRef dim, bool keepdim,
                     std::optional<at::ScalarType> dtype, const char* name) {
  checkFloat64(name, self.scalar_type());
  if (dtype.has_value()) checkFloat64(name, *dtype);
  const auto device = self.device().index();
  HostViewSet views;
  const at::Tensor host = views.viewOf(self);
  return views.toNeuron(
      runOnDevice(device, name, [&] { return at::cpu::sum(host, dim, keepdim, dtype); }), device,
      name);
}

at::Tensor sum_dim(const at::Tensor& self, at::OptionalIntArrayRef dim, bool keepdim,
                   std::optional<at::ScalarType> dtype) {
  return sumOnHost(self, dim, keepdim, dtype, "aten::sum.dim_IntList");
}

at::Tensor sum_all(const at::Tensor& self, std::optional<at::ScalarType> dtype) {
  return sumOnHost(self, c10::IntArrayRef{}, false, dtype, "aten::sum");
}

}  // namespace

TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {
  m.impl("sum.dim_IntList", sum_dim);
  m.impl("sum", sum_all);
}

}  // namespace neuron
