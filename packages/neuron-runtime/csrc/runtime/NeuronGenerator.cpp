// Per-core default generators and the generator implementation.
#include "runtime/NeuronGenerator.h"

#include "driver/DeviceState.h"

#include <ATen/CPUGeneratorImpl.h>
#include <c10/core/GeneratorImpl.h>
#include <c10/util/Exception.h>

#include <memory>
#include <mutex>
#include <vector>

namespace neuron {

NeuronGeneratorImpl::NeuronGeneratorImpl(c10::DeviceIndex device, uint64_t seed)
    : c10::GeneratorImpl(c10::Device(c10::DeviceType::PrivateUse1, device),
                         c10::DispatchKeySet(c10::DispatchKey::PrivateUse1)),
      engine_(at::make_generator<at::CPUGeneratorImpl>(seed)) {}

void NeuronGeneratorImpl::set_current_seed(uint64_t seed) {
  engine_.set_current_seed(seed);
}

void NeuronGeneratorImpl::set_offset(uint64_t /*offset*/) {
  TORCH_CHECK(false, "neuron generators use a Mersenne Twister state, not a Philox offset; "
                     "use set_state/get_state instead of set_offset.");
}

uint64_t NeuronGeneratorImpl::get_offset() const {
  TORCH_CHECK(false, "neuron generators use a Mersenne Twister state, not a Philox offset; "
                     "use get_state instead of get_offset.");
}

uint64_t NeuronGeneratorImpl::current_seed() const {
  return engine_.current_seed();
}

uint64_t NeuronGeneratorImpl::seed() {
  return engine_.seed();
}

void NeuronGeneratorImpl::set_state(const c10::TensorImpl& new_state) {
  engine_.unsafeGetGeneratorImpl()->set_state(new_state);
}

c10::intrusive_ptr<c10::TensorImpl> NeuronGeneratorImpl::get_state() const {
  return engine_.unsafeGetGeneratorImpl()->get_state();
}

NeuronGeneratorImpl* NeuronGeneratorImpl::clone_impl() const {
  auto copy = std::make_unique<NeuronGeneratorImpl>(device().index(), engine_.current_seed());
  copy->engine_ = engine_.clone();
  return copy.release();
}

const at::Generator& defaultGenerator(c10::DeviceIndex device) {
  static std::mutex mutex;
  static auto* generators = new std::vector<std::unique_ptr<at::Generator>>();
  const auto index = device < 0 ? currentDevice() : device;
  checkDeviceIndex(index);
  std::lock_guard<std::mutex> lock(mutex);
  if (generators->size() < static_cast<size_t>(deviceCount())) {
    generators->resize(static_cast<size_t>(deviceCount()));
  }
  auto& slot = (*generators)[static_cast<size_t>(index)];
  if (!slot) {
    slot = std::make_unique<at::Generator>(
        at::make_generator<NeuronGeneratorImpl>(index, c10::default_rng_seed_val));
  }
  return *slot;
}

at::Generator makeGenerator(c10::DeviceIndex device) {
  const auto index = device < 0 ? currentDevice() : device;
  checkDeviceIndex(index);
  return at::make_generator<NeuronGeneratorImpl>(index, c10::default_rng_seed_val);
}

}  // namespace neuron
