// Thread-safe op counters and the float64 policy.
#include "aten/OpAccounting.h"

#include "driver/RuntimeConfig.h"

#include <c10/util/Exception.h>

#include <atomic>
#include <mutex>

namespace neuron {
namespace {

std::mutex g_mutex;
std::map<std::string, int64_t> g_copy_fallbacks;
std::map<std::string, int64_t> g_float64;
std::map<std::string, int64_t> g_zero_copy;
std::atomic<bool> g_metrics_enabled{false};
std::atomic<bool> g_float64_warned{false};
thread_local bool t_float64_exempt = false;

}  // namespace

void recordCopyFallback(const std::string& op_name) {
  std::lock_guard<std::mutex> lock(g_mutex);
  g_copy_fallbacks[op_name] += 1;
}

void checkFloat64(const std::string& op_name, c10::ScalarType dtype) {
  if (!isFloat64Like(dtype)) return;
  const auto policy = runtimeConfig().float64;
  if (policy == Float64Policy::kAllow || t_float64_exempt) return;
  TORCH_CHECK_TYPE(
      policy != Float64Policy::kError,
      "neuron: ", op_name, " uses ", c10::toString(dtype),
      ", which Trainium hardware does not support (TorchNeuron would run it on the CPU). "
      "Use float32 or bfloat16, or set NEURON_EMU_FLOAT64=warn to allow it on the emulator.");
  {
    std::lock_guard<std::mutex> lock(g_mutex);
    g_float64[op_name] += 1;
  }
  if (!g_float64_warned.exchange(true)) {
    TORCH_WARN(
        "neuron: ", op_name, " uses ", c10::toString(dtype),
        ", which Trainium hardware does not support: on real hardware TorchNeuron moves "
        "64-bit work to the CPU. The emulator runs it and counts it "
        "(torch_neuronx.get_float64_ops()). Set NEURON_EMU_FLOAT64=error to make this an "
        "error. This warning is shown once.");
  }
}

bool setFloat64Exempt(bool exempt) {
  const bool previous = t_float64_exempt;
  t_float64_exempt = exempt;
  return previous;
}

void recordZeroCopyOp(const std::string& op_name) {
  std::lock_guard<std::mutex> lock(g_mutex);
  g_zero_copy[op_name] += 1;
}

std::map<std::string, int64_t> copyFallbackCounts() {
  std::lock_guard<std::mutex> lock(g_mutex);
  return g_copy_fallbacks;
}

std::map<std::string, int64_t> float64Counts() {
  std::lock_guard<std::mutex> lock(g_mutex);
  return g_float64;
}

std::map<std::string, int64_t> zeroCopyCounts() {
  std::lock_guard<std::mutex> lock(g_mutex);
  return g_zero_copy;
}

void resetOpCounts() {
  std::lock_guard<std::mutex> lock(g_mutex);
  g_copy_fallbacks.clear();
  g_float64.clear();
  g_zero_copy.clear();
}

void setOpMetricsEnabled(bool enabled) {
  g_metrics_enabled.store(enabled);
}

bool opMetricsEnabled() {
  return g_metrics_enabled.load(std::memory_order_relaxed);
}

}  // namespace neuron
