// The per-channel statistics kernels nn.SyncBatchNorm calls, which ATen implements for CUDA
// only (batch_norm_stats, batch_norm_gather_stats_with_counts, batch_norm_elemt,
// batch_norm_backward_reduce, batch_norm_backward_elemt). They are CUDA's formulas written as
// ordinary ops on neuron tensors: statistics in float32 for half-precision inputs (as CUDA's
// accumulate type), outputs in the input's dtype, channels on dimension 1.
#include <ATen/ATen.h>
#include <torch/library.h>

#include <tuple>
#include <vector>

namespace neuron {
namespace {

at::ScalarType accumulateType(const at::Tensor& input) {
  return input.scalar_type() == at::kDouble ? at::kDouble : at::kFloat;
}

// Every dimension but the channel dimension (1).
std::vector<int64_t> reducedDims(const at::Tensor& input) {
  TORCH_CHECK(input.dim() >= 2, "SyncBatchNorm: expected an input with at least 2 dimensions (N, C, ...), got ",
              input.dim(), " dimensions.");
  std::vector<int64_t> dims{0};
  for (int64_t d = 2; d < input.dim(); ++d) dims.push_back(d);
  return dims;
}

// A per-channel vector shaped to broadcast against `input` (C -> 1, C, 1, ...).
at::Tensor perChannel(const at::Tensor& values, const at::Tensor& input) {
  std::vector<int64_t> shape(input.dim(), 1);
  shape[1] = values.numel();
  return values.reshape(shape);
}

at::Tensor scaleOf(const at::Tensor& invstd, const std::optional<at::Tensor>& weight) {
  if (weight.has_value() && weight->defined()) return invstd * weight->to(invstd.scalar_type());
  return invstd;
}

std::tuple<at::Tensor, at::Tensor> batch_norm_stats(const at::Tensor& input, double eps) {
  const at::Tensor x = input.to(accumulateType(input));
  auto [var, mean] = at::var_mean(x, reducedDims(input), /*correction=*/0, /*keepdim=*/false);
  return {mean, (var + eps).rsqrt()};
}

std::tuple<at::Tensor, at::Tensor> batch_norm_gather_stats_with_counts(
    const at::Tensor& /*input*/, const at::Tensor& mean, const at::Tensor& invstd,
    const std::optional<at::Tensor>& running_mean, const std::optional<at::Tensor>& running_var,
    double momentum, double eps, const at::Tensor& counts) {
  // Merges each rank's (count, mean, biased variance), as CUDA's kernel does.
  const at::Tensor count = counts.to(mean.scalar_type()).reshape({-1, 1});
  const at::Tensor total = count.sum();
  const at::Tensor global_mean = (mean * count).sum(0) / total;
  const at::Tensor rank_var = invstd.pow(-2) - eps;
  const at::Tensor var = (count * (rank_var + (mean - global_mean).pow(2))).sum(0) / total;
  if (running_mean.has_value() && running_mean->defined()) {
    running_mean->mul_(1 - momentum).add_(global_mean.to(running_mean->scalar_type()) * momentum);
  }
  if (running_var.has_value() && running_var->defined()) {
    const at::Tensor unbiased = var * total / (total - 1);
    running_var->mul_(1 - momentum).add_(unbiased.to(running_var->scalar_type()) * momentum);
  }
  return {global_mean, (var + eps).rsqrt()};
}

at::Tensor batch_norm_elemt(const at::Tensor& input, const std::optional<at::Tensor>& weight,
                            const std::optional<at::Tensor>& bias, const at::Tensor& mean,
                            const at::Tensor& invstd, double /*eps*/) {
  const at::Tensor scale = scaleOf(invstd, weight);
  at::Tensor shift = -mean * scale;
  if (bias.has_value() && bias->defined()) shift = shift + bias->to(scale.scalar_type());
  const at::Tensor x = input.to(scale.scalar_type());
  return (x * perChannel(scale, input) + perChannel(shift, input)).to(input.scalar_type());
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> batch_norm_backward_reduce(
    const at::Tensor& grad_out, const at::Tensor& input, const at::Tensor& mean, const at::Tensor& invstd,
    const std::optional<at::Tensor>& weight, bool input_g, bool weight_g, bool bias_g) {
  const auto dims = reducedDims(input);
  const at::Tensor dy = grad_out.to(mean.scalar_type());
  const at::Tensor xmu = input.to(mean.scalar_type()) - perChannel(mean, input);
  const at::Tensor sum_dy = dy.sum(dims);
  const at::Tensor sum_dy_xmu = (dy * xmu).sum(dims);
  const bool has_weight = weight.has_value() && weight->defined();
  const auto param_dtype = has_weight ? weight->scalar_type() : mean.scalar_type();
  return {
      input_g ? sum_dy : at::Tensor(),
      input_g ? sum_dy_xmu : at::Tensor(),
      weight_g ? (sum_dy_xmu * invstd).to(param_dtype) : at::Tensor(),
      bias_g ? sum_dy.to(param_dtype) : at::Tensor(),
  };
}

at::Tensor batch_norm_backward_elemt(const at::Tensor& grad_out, const at::Tensor& input, const at::Tensor& mean,
                                     const at::Tensor& invstd, const std::optional<at::Tensor>& weight,
                                     const at::Tensor& sum_dy, const at::Tensor& sum_dy_xmu,
                                     const at::Tensor& count) {
  // sum_dy and sum_dy_xmu are already summed over every rank; count holds each rank's size.
  const auto acc = mean.scalar_type();
  const at::Tensor total = count.to(acc).sum();
  const at::Tensor mean_dy = sum_dy / total;
  const at::Tensor mean_dy_xmu = sum_dy_xmu / total;
  const at::Tensor xmu = input.to(acc) - perChannel(mean, input);
  const at::Tensor centred = grad_out.to(acc) - perChannel(mean_dy, input) -
                             xmu * perChannel(invstd * invstd * mean_dy_xmu, input);
  return (centred * perChannel(scaleOf(invstd, weight), input)).to(input.scalar_type());
}

}  // namespace

TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {
  m.impl("batch_norm_stats", batch_norm_stats);
  m.impl("batch_norm_gather_stats_with_counts", batch_norm_gather_stats_with_counts);
  m.impl("batch_norm_elemt", batch_norm_elemt);
  m.impl("batch_norm_backward_reduce", batch_norm_backward_reduce);
  m.impl("batch_norm_backward_elemt", batch_norm_backward_elemt);
}

}  // namespace neuron
