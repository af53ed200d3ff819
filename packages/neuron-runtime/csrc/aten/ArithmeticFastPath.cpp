// Unboxed kernels for the four arithmetic ops that dominate eager programs (add, sub, mul,
// div; functional and in-place). They do what the zero-copy fallback does, without packing
// arguments on a stack and going through the dispatcher twice: check devices, view the
// operands as CPU tensors, call ATen's CPU kernel directly, adopt the result.
#include "aten/HostViews.h"
#include "aten/OpAccounting.h"

#include <ATen/ops/add_cpu_dispatch.h>
#include <ATen/ops/div_cpu_dispatch.h>
#include <ATen/ops/mul_cpu_dispatch.h>
#include <ATen/ops/sub_cpu_dispatch.h>
#include <torch/library.h>

namespace neuron {
namespace {

// The op's core; a CPU operand must be a 0-dim scalar, as on CUDA.
c10::DeviceIndex operandDevice(const at::Tensor& self, const at::Tensor& other, const char* name) {
  const at::Tensor& device_tensor = self.is_privateuseone() ? self : other;
  const at::Tensor& second = self.is_privateuseone() ? other : self;
  const char* second_name = self.is_privateuseone() ? "other" : "self";
  if (second.is_privateuseone()) {
    TORCH_CHECK(second.device() == device_tensor.device(),
                "Expected all tensors to be on the same device, but found at least two devices, ",
                device_tensor.device(), " and ", second.device(), "! (when checking argument '",
                second_name, "' of ", name, ")");
  } else {
    TORCH_CHECK(second.dim() == 0,
                "Expected all tensors to be on the same device, but found at least two devices, ",
                device_tensor.device(), " and ", second.device(), "! (when checking argument '",
                second_name, "' of ", name, "). Move it with .to(\"", device_tensor.device(), "\").");
  }
  if (self.is_privateuseone()) checkFloat64(name, self.scalar_type());
  if (other.is_privateuseone()) checkFloat64(name, other.scalar_type());
  return device_tensor.device().index();
}

template <typename Kernel>
at::Tensor functional(const at::Tensor& self, const at::Tensor& other, const char* name, Kernel kernel) {
  const auto device = operandDevice(self, other, name);
  HostViewSet views;
  const at::Tensor a = self.is_privateuseone() ? views.viewOf(self) : self;
  const at::Tensor b = other.is_privateuseone() ? views.viewOf(other) : other;
  at::Tensor result =
      views.toNeuron(runOnDevice(device, name, [&] { return kernel(a, b); }), device, name);
  checkFloat64(name, result.scalar_type());
  return result;
}

template <typename Kernel>
at::Tensor& inplace(at::Tensor& self, const at::Tensor& other, const char* name, Kernel kernel) {
  TORCH_CHECK(self.is_privateuseone(), "neuron: in-place ", name, " on a ", self.device(),
              " tensor with a neuron operand; move self to neuron first.");
  const auto device = operandDevice(self, other, name);
  HostViewSet views;
  at::Tensor a = views.viewOf(self);
  const at::Tensor b = other.is_privateuseone() ? views.viewOf(other) : other;
  runOnDevice(device, name, [&] {
    kernel(a, b);
    return 0;
  });
  return self;
}

at::Tensor add(const at::Tensor& self, const at::Tensor& other, const at::Scalar& alpha) {
  return functional(self, other, "aten::add.Tensor",
                    [&](const at::Tensor& a, const at::Tensor& b) { return at::cpu::add(a, b, alpha); });
}
at::Tensor sub(const at::Tensor& self, const at::Tensor& other, const at::Scalar& alpha) {
  return functional(self, other, "aten::sub.Tensor",
                    [&](const at::Tensor& a, const at::Tensor& b) { return at::cpu::sub(a, b, alpha); });
}
at::Tensor mul(const at::Tensor& self, const at::Tensor& other) {
  return functional(self, other, "aten::mul.Tensor",
                    [](const at::Tensor& a, const at::Tensor& b) { return at::cpu::mul(a, b); });
}
at::Tensor div(const at::Tensor& self, const at::Tensor& other) {
  return functional(self, other, "aten::div.Tensor",
                    [](const at::Tensor& a, const at::Tensor& b) { return at::cpu::div(a, b); });
}
at::Tensor& add_(at::Tensor& self, const at::Tensor& other, const at::Scalar& alpha) {
  return inplace(self, other, "aten::add_.Tensor",
                 [&](at::Tensor& a, const at::Tensor& b) { at::cpu::add_(a, b, alpha); });
}
at::Tensor& sub_(at::Tensor& self, const at::Tensor& other, const at::Scalar& alpha) {
  return inplace(self, other, "aten::sub_.Tensor",
                 [&](at::Tensor& a, const at::Tensor& b) { at::cpu::sub_(a, b, alpha); });
}
at::Tensor& mul_(at::Tensor& self, const at::Tensor& other) {
  return inplace(self, other, "aten::mul_.Tensor",
                 [](at::Tensor& a, const at::Tensor& b) { at::cpu::mul_(a, b); });
}
at::Tensor& div_(at::Tensor& self, const at::Tensor& other) {
  return inplace(self, other, "aten::div_.Tensor",
                 [](at::Tensor& a, const at::Tensor& b) { at::cpu::div_(a, b); });
}

}  // namespace

TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {
  m.impl("add.Tensor", add);
  m.impl("sub.Tensor", sub);
  m.impl("mul.Tensor", mul);
  m.impl("div.Tensor", div);
  m.impl("add_.Tensor", add_);
  m.impl("sub_.Tensor", sub_);
  m.impl("mul_.Tensor", mul_);
  m.impl("div_.Tensor", div_);
}

}  // namespace neuron
