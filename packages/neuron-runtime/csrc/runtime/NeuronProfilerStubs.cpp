// Device hooks for PyTorch's legacy autograd profiler
// (`torch.autograd.profiler.profile(use_device="neuron")`), which asks the device's profiler
// stubs for the current device and a device timestamp at each op's start and end. Without
// them every op raised inside the profiler's callback (printed with a backtrace) and the
// recorded times were uninitialised. Streams run in order on the host, so a device
// timestamp is the host clock at the moment the op is recorded, as CUDA events would
// read once the stream reaches them.
#include "driver/DeviceState.h"

#include <c10/util/ApproximateClock.h>
#include <torch/csrc/profiler/stubs/base.h>

#include <chrono>
#include <memory>

namespace neuron {
namespace {

using torch::profiler::impl::ProfilerVoidEventStub;

int64_t steadyNanoseconds() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

struct NeuronProfilerStubs final : public torch::profiler::impl::ProfilerStubs {
  void record(c10::DeviceIndex* device, ProfilerVoidEventStub* event, int64_t* cpu_ns) const override {
    if (device != nullptr) *device = currentDevice();
    if (cpu_ns != nullptr) *cpu_ns = c10::getTime();
    if (event != nullptr) *event = std::make_shared<int64_t>(steadyNanoseconds());
  }

  // Microseconds between two recorded events, as the CUDA stubs return.
  float elapsed(const ProfilerVoidEventStub* event, const ProfilerVoidEventStub* event2) const override {
    const auto start = *static_cast<const int64_t*>(event->get());
    const auto end = *static_cast<const int64_t*>(event2->get());
    return static_cast<float>(end - start) / 1000.0f;
  }

  void mark(const char* /*name*/) const override {}
  void rangePush(const char* /*name*/) const override {}
  void rangePop() const override {}
  bool enabled() const override { return true; }

  void onEachDevice(std::function<void(int)> op) const override {
    const auto previous = currentDevice();
    for (c10::DeviceIndex index = 0; index < deviceCount(); ++index) {
      setCurrentDevice(index);
      op(index);
    }
    setCurrentDevice(previous);
  }

  void synchronize() const override {}  // every stream is always complete
};

// Lives as long as the library; the profiler keeps a pointer to it.
NeuronProfilerStubs profilerStubs;

struct RegisterProfilerStubs {
  RegisterProfilerStubs() { torch::profiler::impl::registerPrivateUse1Methods(&profilerStubs); }
};
const RegisterProfilerStubs kRegisterProfilerStubs;

}  // namespace
}  // namespace neuron
