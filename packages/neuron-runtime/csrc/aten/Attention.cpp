// scaled_dot_product_attention on neuron picks the same fused kernel the CPU would (its
// flash-attention kernel), instead of the unfused math path the dispatcher uses for a
// device with no choice function; results then equal the CPU's.
#include "aten/HostViews.h"

#include <ATen/native/transformers/attention.h>
#include <ATen/ops/_fused_sdp_choice_native.h>
#include <ATen/ops/empty_strided.h>
#include <c10/core/impl/LocalDispatchKeySet.h>

#include <vector>

namespace neuron {
namespace {

// The CPU's choice depends on which inputs require grad (its flash kernel cannot
// differentiate the mask), so the host views carry the originals' requires_grad flag.
// Host views come from a reused pool: the flag goes on a fresh alias, never on the pooled view.
at::Tensor choiceView(const at::Tensor& tensor) {
  if (tensor.unsafeGetTensorImpl()->has_symbolic_sizes_strides()) {
    // Symbolic sizes (Dynamo tracing with dynamic=True) have no host view. The CPU's choice reads
    // only metadata (ranks, dtypes, how sizes relate, the last stride), so an empty host tensor
    // of the concrete sizes stands in; reading them guards on them, and neuron compiles one graph
    // per shape in any case.
    std::vector<int64_t> sizes, strides;
    for (const c10::SymInt& size : tensor.sym_sizes()) sizes.push_back(size.guard_int(__FILE__, __LINE__));
    for (const c10::SymInt& stride : tensor.sym_strides()) strides.push_back(stride.guard_int(__FILE__, __LINE__));
    at::Tensor stand_in = at::empty_strided(sizes, strides, tensor.options().device(at::kCPU));
    return tensor.requires_grad() ? stand_in.requires_grad_(true) : stand_in;
  }
  at::Tensor view = hostView(tensor);
  if (!tensor.requires_grad()) return view;
  at::Tensor flagged = view.variable_data();  // a new TensorImpl, without dispatching an op
  flagged.requires_grad_(true);
  return flagged;
}

int64_t chooseSdpBackend(const at::Tensor& query, const at::Tensor& key, const at::Tensor& value,
                         const std::optional<at::Tensor>& attn_mask, double dropout_p,
                         bool is_causal, std::optional<double> scale, bool enable_gqa) {
  // The views are real host tensors: while Dynamo traces with fake tensors, the CPU's
  // choice must run on them directly, not through the Python (fake tensor) mode.
  c10::impl::ExcludeDispatchKeyGuard no_python_modes(
      c10::DispatchKeySet({c10::DispatchKey::Python, c10::DispatchKey::PythonTLSSnapshot}));
  std::optional<at::Tensor> mask;
  if (attn_mask.has_value() && attn_mask->defined()) mask = choiceView(*attn_mask);
  return at::native::_fused_sdp_choice_cpp(choiceView(query), choiceView(key), choiceView(value), mask,
                                           dropout_p, is_causal, scale, enable_gqa);
}

}  // namespace
}  // namespace neuron

namespace at::native {
REGISTER_PRIVATEUSE1_DISPATCH(_fused_sdp_choice_stub, &neuron::chooseSdpBackend)
}  // namespace at::native
