// Random kernels whose CPU implementation draws from the CPU's default generator without
// taking a Generator argument: on neuron they must draw from the core's own generator.
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty_like.h>
#include <ATen/ops/ones_like.h>
#include <torch/library.h>

#include <tuple>

namespace neuron {
namespace {

// Mirrors ATen's CPU native_dropout; bernoulli_ on a neuron tensor uses the neuron generator.
std::tuple<at::Tensor, at::Tensor> native_dropout(const at::Tensor& input, double p,
                                                  std::optional<bool> train) {
  if (input.numel() == 0) {
    return {input, at::empty_like(input, input.options())};
  }
  if (!train.has_value() || *train) {
    const double keep = 1. - p;
    const double scale = keep == 0 ? 0. : 1. / keep;
    at::Tensor mask = at::empty_like(input, at::MemoryFormat::Contiguous);
    mask.bernoulli_(keep);
    // The mask comes back as bool, as ATen's CPU and CUDA kernels return it (and autograd saves it).
    return {input.mul(mask).mul_(scale), mask.to(at::kBool)};
  }
  return {input.clone(), at::ones_like(input, input.options().dtype(at::kBool))};
}

}  // namespace

TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {
  m.impl("native_dropout", native_dropout);
}

}  // namespace neuron
