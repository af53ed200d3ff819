// The device guard: how c10 switches the current core, and the stream/event interface
// (torch.Stream, torch.Event and torch.accelerator all go through it).
#include "driver/DeviceState.h"
#include "driver/RuntimeConfig.h"
#include "runtime/NeuronStream.h"

#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <c10/util/Exception.h>

#include <chrono>
#include <memory>

namespace neuron {
namespace {

int64_t nowNs() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

struct NeuronGuardImpl final : public c10::impl::DeviceGuardImplInterface {
  static constexpr c10::DeviceType static_type = c10::DeviceType::PrivateUse1;

  c10::DeviceType type() const override { return static_type; }

  c10::Device exchangeDevice(c10::Device device) const override {
    const c10::Device previous = getDevice();
    if (device.index() != previous.index()) {
      setDevice(device);
    }
    return previous;
  }

  c10::Device getDevice() const override {
    return c10::Device(static_type, currentDevice());
  }

  void setDevice(c10::Device device) const override {
    TORCH_CHECK(device.is_privateuseone(), "neuron guard got a non-neuron device: ", device);
    setCurrentDevice(device.has_index() ? device.index() : currentDevice());
  }

  void uncheckedSetDevice(c10::Device device) const noexcept override {
    if (device.has_index() && device.index() >= 0 && device.index() < deviceCount()) {
      try {
        setCurrentDevice(device.index());
      } catch (...) {
      }
    }
  }

  c10::Stream getStream(c10::Device device) const override {
    return currentStream(indexOf(device));
  }
  c10::Stream getDefaultStream(c10::Device device) const override {
    return defaultStream(indexOf(device));
  }
  c10::Stream getStreamFromGlobalPool(c10::Device device, bool isHighPriority) const override {
    return newStream(indexOf(device), isHighPriority ? kHighestStreamPriority : 0);
  }
  c10::Stream getNewStream(c10::Device device, int priority) const override {
    return newStream(indexOf(device), priority);
  }
  c10::Stream exchangeStream(c10::Stream stream) const override {
    return neuron::exchangeStream(stream);
  }

  c10::DeviceIndex deviceCount() const noexcept override { return neuron::deviceCount(); }

  // torch.accelerator.get_device_capability: the dtypes a neuron tensor can hold.
  c10::DeviceCapability getDeviceCapability(c10::Device device) const override {
    checkDeviceIndex(indexOf(device));
    c10::DeviceCapability capability;  // every dtype on
    auto& types = capability.capability_data.supported_scalar_types;
    // Quantized tensors are refused on neuron (UnsupportedTensorKinds.cpp).
    types.has_QInt8 = types.has_QUInt8 = types.has_QInt32 = 0;
    types.has_QUInt4x2 = types.has_QUInt2x4 = 0;
    // Bit-packed and sub-byte types: storage only, no conversions (none on the CPU either).
    types.has_Bits1x8 = types.has_Bits2x4 = types.has_Bits4x2 = types.has_Bits8 = 0;
    types.has_Bits16 = types.has_Float4_e2m1fn_x2 = 0;
    types.has_UInt1 = types.has_UInt2 = types.has_UInt3 = types.has_UInt4 = 0;
    types.has_UInt5 = types.has_UInt6 = types.has_UInt7 = 0;
    types.has_Int1 = types.has_Int2 = types.has_Int3 = types.has_Int4 = 0;
    types.has_Int5 = types.has_Int6 = types.has_Int7 = 0;
    if (runtimeConfig().float64 == Float64Policy::kError) {
      types.has_Double = types.has_ComplexDouble = 0;  // NEURON_EMU_FLOAT64=error
    }
    return capability;
  }

  void record(void** event, const c10::Stream& stream, const c10::DeviceIndex device_index,
              const c10::EventFlag flag) const override {
    TORCH_CHECK(device_index == -1 || device_index == stream.device_index(),
                "Event device index ", static_cast<int>(device_index),
                " does not match recording stream's device index ",
                static_cast<int>(stream.device_index()), ".");
    auto* record = static_cast<EventRecord*>(*event);
    if (record == nullptr) {
      auto fresh = std::make_unique<EventRecord>();
      fresh->device = stream.device_index();
      fresh->enable_timing = flag == c10::EventFlag::BACKEND_DEFAULT;
      record = fresh.release();  // owned by the c10::Event; freed in destroyEvent
      *event = record;
    }
    // Work before this point has already executed (synchronous emulation).
    record->recorded = true;
    record->time_ns = nowNs();
  }

  void block(void* /*event*/, const c10::Stream& /*stream*/) const override {
    // Every recorded event is already complete, so waiting never blocks.
  }

  bool queryEvent(void* /*event*/) const override { return true; }

  void destroyEvent(void* event, const c10::DeviceIndex /*device_index*/) const noexcept override {
    std::unique_ptr<EventRecord> owned(static_cast<EventRecord*>(event));
  }

  bool queryStream(const c10::Stream& /*stream*/) const override { return true; }
  void synchronizeStream(const c10::Stream& /*stream*/) const override {}
  void synchronizeEvent(void* /*event*/) const override {}
  void synchronizeDevice(const c10::DeviceIndex device_index) const override {
    checkDeviceIndex(device_index);
  }
  void recordDataPtrOnStream(const c10::DataPtr& /*data_ptr*/,
                             const c10::Stream& /*stream*/) const override {}

  double elapsedTime(void* start, void* end, const c10::DeviceIndex /*device_index*/)
      const override {
    auto* first = static_cast<EventRecord*>(start);
    auto* second = static_cast<EventRecord*>(end);
    TORCH_CHECK(first != nullptr && second != nullptr,
                "Both events must be recorded before calculating elapsed time.");
    TORCH_CHECK(first->enable_timing && second->enable_timing,
                "Both events must be created with argument 'enable_timing=True' to measure "
                "elapsed time.");
    return static_cast<double>(second->time_ns - first->time_ns) / 1.0e6;
  }

 private:
  static c10::DeviceIndex indexOf(c10::Device device) {
    return device.has_index() ? device.index() : currentDevice();
  }
};

C10_REGISTER_GUARD_IMPL(PrivateUse1, NeuronGuardImpl);

}  // namespace
}  // namespace neuron
