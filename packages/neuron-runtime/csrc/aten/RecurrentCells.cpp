// The fused LSTM and GRU cells ATen's recurrent layers call on every non-CPU device
// (aten/src/ATen/native/RNN.cpp takes the fused path for CUDA, XPU and PrivateUse1), which
// upstream implements only for CUDA. Here they are the CPU cell's arithmetic as ordinary ops:
// registered for Autograd as well, autograd differentiates them (double backward included),
// so the CUDA-only backward kernels are never needed. The workspace output has CUDA's shape
// and contents (LSTM: the four activated gates; GRU: r, z, n, hx and the hidden n-gate).
#include <ATen/ATen.h>
#include <torch/library.h>

namespace neuron {
namespace {

at::Tensor withBias(const at::Tensor& gates, const std::optional<at::Tensor>& bias) {
  return bias.has_value() && bias->defined() ? gates + *bias : gates;
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> fusedLstmCell(
    const at::Tensor& input_gates, const at::Tensor& hidden_gates, const at::Tensor& cx,
    const std::optional<at::Tensor>& input_bias, const std::optional<at::Tensor>& hidden_bias) {
  // The CPU cell's order: (hx W_hh^T + b_hh) + (x W_ih^T + b_ih).
  const auto gates = withBias(hidden_gates, hidden_bias) + withBias(input_gates, input_bias);
  const auto chunks = gates.chunk(4, 1);
  const auto ingate = chunks[0].sigmoid();
  const auto forgetgate = chunks[1].sigmoid();
  const auto cellgate = chunks[2].tanh();
  const auto outgate = chunks[3].sigmoid();
  auto cy = forgetgate * cx + ingate * cellgate;
  auto hy = outgate * cy.tanh();
  auto workspace = at::cat({ingate, forgetgate, cellgate, outgate}, 1);
  return {std::move(hy), std::move(cy), std::move(workspace)};
}

std::tuple<at::Tensor, at::Tensor> fusedGruCell(
    const at::Tensor& input_gates, const at::Tensor& hidden_gates, const at::Tensor& hx,
    const std::optional<at::Tensor>& input_bias, const std::optional<at::Tensor>& hidden_bias) {
  const auto igates = withBias(input_gates, input_bias).chunk(3, 1);
  const auto hgates = withBias(hidden_gates, hidden_bias).chunk(3, 1);
  const auto reset_gate = (hgates[0] + igates[0]).sigmoid();
  const auto input_gate = (hgates[1] + igates[1]).sigmoid();
  const auto new_gate = (igates[2] + hgates[2] * reset_gate).tanh();
  auto hy = (hx - new_gate) * input_gate + new_gate;
  auto workspace = at::cat({reset_gate, input_gate, new_gate, hx, hgates[2]}, 1);
  return {std::move(hy), std::move(workspace)};
}

}  // namespace

TORCH_LIBRARY_IMPL(aten, AutogradPrivateUse1, m) {
  m.impl("_thnn_fused_lstm_cell", &fusedLstmCell);
  m.impl("_thnn_fused_gru_cell", &fusedGruCell);
}

TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {  // inference mode skips the Autograd key
  m.impl("_thnn_fused_lstm_cell", &fusedLstmCell);
  m.impl("_thnn_fused_gru_cell", &fusedGruCell);
}

}  // namespace neuron
