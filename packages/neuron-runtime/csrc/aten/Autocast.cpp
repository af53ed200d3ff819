// torch.autocast("neuron"): the same cast policies CUDA uses (matmul-like ops in the low
// precision dtype; softmax, norms, losses and reductions in float32; mixed inputs promoted).
#include <ATen/autocast_mode.h>
#include <torch/library.h>

namespace neuron {
namespace {
// The KERNEL_* macros and op lists expect ATen's unqualified names.
using namespace at::autocast;  // NOLINT
using at::Scalar;
using at::Tensor;
using c10::IntArrayRef;
using c10::ScalarType;

// CUDA bans binary_cross_entropy under autocast (its input may be a low-precision probability
// whose log is unsafe); neuron follows CUDA rather than computing it silently in half precision.
Tensor binaryCrossEntropyBanned(const Tensor& /*self*/, const Tensor& /*target*/,
                                const std::optional<Tensor>& /*weight*/, int64_t /*reduction*/) {
  TORCH_CHECK(false,
              "torch.nn.functional.binary_cross_entropy and torch.nn.BCELoss are unsafe to autocast.\n"
              "Many models use a sigmoid layer right before the binary cross entropy layer.\n"
              "In this case, combine the two layers using torch.nn.functional.binary_cross_entropy_with_logits\n"
              "or torch.nn.BCEWithLogitsLoss.  binary_cross_entropy_with_logits and BCEWithLogits are\n"
              "safe to autocast.");
}

TORCH_LIBRARY_IMPL(aten, AutocastPrivateUse1, m) {
#define NEURON_LOW_PRECISION(...) KERNEL_PRIVATEUSEONE(__VA_ARGS__, lower_precision_fp)
#define NEURON_FP32(...) KERNEL_PRIVATEUSEONE(__VA_ARGS__, fp32)
#define NEURON_FP32_SET_OPT_DTYPE(...) KERNEL_PRIVATEUSEONE(__VA_ARGS__, fp32_set_opt_dtype)
#define NEURON_FP32_APPEND_DTYPE(...) KERNEL_DIFFERENT_REDISPATCH_SIGNATURE_PRIVATEUSEONE(__VA_ARGS__)
#define NEURON_PROMOTE(...) KERNEL_PRIVATEUSEONE(__VA_ARGS__, promote)
  AT_FORALL_LOWER_PRECISION_FP(NEURON_LOW_PRECISION)
  AT_FORALL_FP32(NEURON_FP32)
  AT_FORALL_FP32_SET_OPT_DTYPE(NEURON_FP32_SET_OPT_DTYPE)
  AT_FORALL_DIFFERENT_REDISPATCH_SIGNATURE(NEURON_FP32_APPEND_DTYPE)
  AT_FORALL_PROMOTE(NEURON_PROMOTE)
#undef NEURON_LOW_PRECISION
#undef NEURON_FP32
#undef NEURON_FP32_SET_OPT_DTYPE
#undef NEURON_FP32_APPEND_DTYPE
#undef NEURON_PROMOTE
  m.impl("binary_cross_entropy", TORCH_FN(binaryCrossEntropyBanned));
}

// Ops without a cast policy run unchanged.
TORCH_LIBRARY_IMPL(_, AutocastPrivateUse1, m) {
  m.fallback(torch::CppFunction::makeFallthrough());
}

}  // namespace
}  // namespace neuron
