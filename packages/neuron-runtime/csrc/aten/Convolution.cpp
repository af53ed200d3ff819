// Convolutions on neuron. For a device outside its built-in list, ATen routes convolution
// to `convolution_overrideable` (and its backward), which has no CPU kernel; these run
// ATen's CPU convolution on zero-copy views of the neuron arguments.
#include "aten/HostViews.h"

#include <ATen/ops/convolution.h>
#include <ATen/ops/convolution_backward.h>
#include <torch/library.h>

#include <array>
#include <tuple>

namespace neuron {
namespace {

at::Tensor convolution_overrideable(const at::Tensor& input, const at::Tensor& weight,
                                    const std::optional<at::Tensor>& bias, c10::IntArrayRef stride,
                                    c10::IntArrayRef padding, c10::IntArrayRef dilation,
                                    bool transposed, c10::IntArrayRef output_padding,
                                    int64_t groups) {
  HostViewSet views;
  std::optional<at::Tensor> host_bias;
  if (bias.has_value() && bias->defined()) host_bias = views.viewOf(*bias);
  const auto device = input.device().index();
  const char* name = "aten::convolution_overrideable";
  return views.toNeuron(runOnDevice(device, name, [&] {
                          return at::convolution(views.viewOf(input), views.viewOf(weight), host_bias,
                                                 stride, padding, dilation, transposed,
                                                 output_padding, groups);
                        }),
                        device, name);
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> convolution_backward_overrideable(
    const at::Tensor& grad_output, const at::Tensor& input, const at::Tensor& weight,
    c10::IntArrayRef stride, c10::IntArrayRef padding, c10::IntArrayRef dilation, bool transposed,
    c10::IntArrayRef output_padding, int64_t groups, std::array<bool, 3> output_mask) {
  HostViewSet views;
  const auto device = input.device().index();
  const std::vector<int64_t> bias_sizes = {grad_output.size(1)};
  const char* name = "aten::convolution_backward_overrideable";
  auto grads = runOnDevice(device, name, [&] {
    return at::convolution_backward(views.viewOf(grad_output), views.viewOf(input),
                                    views.viewOf(weight), bias_sizes, stride, padding, dilation,
                                    transposed, output_padding, groups, output_mask);
  });
  return {views.toNeuron(std::get<0>(grads), device, name),
          views.toNeuron(std::get<1>(grads), device, name),
          views.toNeuron(std::get<2>(grads), device, name)};
}

}  // namespace

TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {
  m.impl("convolution_overrideable", convolution_overrideable);
  m.impl("convolution_backward_overrideable", convolution_backward_overrideable);
}

}  // namespace neuron
