// Sparse, sparse CSR, quantized and (strided-layout) nested neuron tensors: the device holds strided (dense) tensors
// only, as the hardware's compiler does. Any op reaching these dispatch keys gets one error
// saying so and what to do, instead of the dispatcher's "Could not run ... with arguments
// from the 'SparsePrivateUse1' backend".
#include <ATen/core/dispatch/Dispatcher.h>
#include <c10/util/Exception.h>
#include <torch/library.h>

namespace neuron {
namespace {

[[noreturn]] void refuse(const c10::OperatorHandle& op, const char* kind, const char* convert) {
  TORCH_CHECK_NOT_IMPLEMENTED(false, "neuron: ", op.schema().operator_name(), ": ", kind,
                              " tensors are not supported on the neuron device, which holds strided "
                              "(dense) tensors only. Keep ", kind, " tensors on the CPU, or convert them with ",
                              convert, " before moving them to neuron.");
}

void refuseSparse(const c10::OperatorHandle& op, torch::jit::Stack*) {
  refuse(op, "sparse", ".to_dense()");
}

void refuseQuantized(const c10::OperatorHandle& op, torch::jit::Stack*) {
  refuse(op, "quantized", ".dequantize()");
}

void refuseNested(const c10::OperatorHandle& op, torch::jit::Stack*) {
  refuse(op, "nested", "layout=torch.jagged (torch.nested's Python layout, which works on any device)");
}

}  // namespace

TORCH_LIBRARY_IMPL(_, SparsePrivateUse1, m) {
  m.fallback(torch::CppFunction::makeFromBoxedFunction<&refuseSparse>());
}

TORCH_LIBRARY_IMPL(_, SparseCsrPrivateUse1, m) {
  m.fallback(torch::CppFunction::makeFromBoxedFunction<&refuseSparse>());
}

TORCH_LIBRARY_IMPL(_, QuantizedPrivateUse1, m) {
  m.fallback(torch::CppFunction::makeFromBoxedFunction<&refuseQuantized>());
}

TORCH_LIBRARY_IMPL(_, NestedTensorPrivateUse1, m) {
  m.fallback(torch::CppFunction::makeFromBoxedFunction<&refuseNested>());
}

// The ops that build a strided nested tensor from dense neuron tensors are refused when called:
// one built anyway from inputs that require grad aborted the process, since autograd records
// the new tensor's nested sizes in a noexcept function and that lookup is refused above.
TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {
  for (const char* name : {"_nested_tensor_from_tensor_list", "_nested_from_padded", "_nested_tensor_from_mask",
                           "_nested_view_from_buffer", "_nested_view_from_buffer_copy"}) {
    m.impl(name, torch::CppFunction::makeFromBoxedFunction<&refuseNested>());
  }
}

}  // namespace neuron
