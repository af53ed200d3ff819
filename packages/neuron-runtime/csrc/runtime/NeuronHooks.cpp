// The PrivateUse1 hooks: what makes `neuron` torch's current accelerator, and how torch
// finds the device's generators, pinned memory and device count.
#include "driver/DeviceState.h"
#include "runtime/NeuronCachingAllocator.h"
#include "runtime/NeuronGenerator.h"
#include "runtime/NeuronHostAllocator.h"

#include <ATen/detail/PrivateUse1HooksInterface.h>
#include <ATen/native/Resize.h>
#include <c10/util/Exception.h>

#include <cstring>

namespace neuron {
namespace {

struct NeuronHooks final : public at::PrivateUse1HooksInterface {
  bool isBuilt() const override { return true; }
  bool isAvailable() const override { return deviceCount() > 0; }
  void init() const override { lazyInitDevice(); }
  bool hasPrimaryContext(c10::DeviceIndex device_index) const override {
    return isInitialized() && device_index >= 0 && device_index < deviceCount();
  }
  c10::DeviceIndex deviceCount() const override { return neuron::deviceCount(); }
  void setCurrentDevice(c10::DeviceIndex device) const override { neuron::setCurrentDevice(device); }
  c10::DeviceIndex getCurrentDevice() const override { return currentDevice(); }
  c10::DeviceIndex exchangeDevice(c10::DeviceIndex device) const override {
    const auto previous = currentDevice();
    if (device != previous) neuron::setCurrentDevice(device);
    return previous;
  }
  c10::DeviceIndex maybeExchangeDevice(c10::DeviceIndex device) const override {
    return exchangeDevice(device);
  }

  const at::Generator& getDefaultGenerator(c10::DeviceIndex device_index) const override {
    return defaultGenerator(device_index);
  }
  at::Generator getNewGenerator(c10::DeviceIndex device_index) const override {
    return makeGenerator(device_index);
  }

  at::Device getDeviceFromPtr(void* data) const override {
    const auto device = cachingAllocator().deviceOfPointer(data);
    TORCH_CHECK(device >= 0, "neuron: pointer ", data, " is not neuron device memory.");
    return {c10::DeviceType::PrivateUse1, device};
  }

  bool isPinnedPtr(const void* data) const override { return hostAllocator().isPinned(data); }
  at::Allocator* getPinnedMemoryAllocator() const override { return &hostAllocator(); }

  void resizePrivateUse1Bytes(const c10::Storage& storage, size_t newsize) const override {
    auto* impl = storage.unsafeGetStorageImpl();
    TORCH_CHECK(impl->resizable(), "Trying to resize storage that is not resizable");
    const auto device = impl->device().index();
    c10::DataPtr fresh = cachingAllocator().allocateOn(newsize, device);
    const size_t keep = std::min(newsize, impl->nbytes());
    if (keep > 0 && impl->data() != nullptr) {
      std::memcpy(fresh.get(), impl->data(), keep);
    }
    impl->set_data_ptr_noswap(std::move(fresh));
    impl->set_nbytes(newsize);
  }
};

struct RegisterHooks {
  RegisterHooks() {
    static NeuronHooks hooks;
    at::RegisterPrivateUse1HooksInterface(&hooks);
  }
} register_hooks;

}  // namespace
}  // namespace neuron
