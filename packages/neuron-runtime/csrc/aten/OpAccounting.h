// Counters the user can read back: ops that needed a copying fallback (TorchNeuron's
// get_fallback_ops), ops that ran in float64 (no Trainium hardware support), and how many
// ops ran through the zero-copy CPU-kernel path.
#pragma once

#include <c10/core/ScalarType.h>

#include <cstdint>
#include <map>
#include <string>

namespace neuron {

// An op whose CPU kernel produced memory outside the neuron allocator, copied to the device.
void recordCopyFallback(const std::string& op_name);
// Applies the float64 policy (warn once and count, or refuse) for an op touching `dtype`.
void checkFloat64(const std::string& op_name, c10::ScalarType dtype);
inline bool isFloat64Like(c10::ScalarType dtype) {
  return dtype == c10::ScalarType::Double || dtype == c10::ScalarType::ComplexDouble;
}
void recordZeroCopyOp(const std::string& op_name);
// Exempts the calling thread from the float64 policy (used while printing a tensor, which
// formats through float64 internally); returns the previous setting.
bool setFloat64Exempt(bool exempt);

std::map<std::string, int64_t> copyFallbackCounts();
std::map<std::string, int64_t> float64Counts();
std::map<std::string, int64_t> zeroCopyCounts();
void resetOpCounts();
// Whether per-op counting of the zero-copy path is on (TORCH_NEURONX_METRICS_ENABLED).
void setOpMetricsEnabled(bool enabled);
bool opMetricsEnabled();

}  // namespace neuron
