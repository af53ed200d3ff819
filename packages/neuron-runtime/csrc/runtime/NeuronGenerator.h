// The device's random number generator. Each core has its own default generator with its
// own state (independent of the CPU's); torch.Generator("neuron") makes new ones. The
// state is a Mersenne Twister, so a seeded neuron run reproduces exactly, and equals a CPU
// run seeded the same way.
#pragma once

#include <ATen/core/Generator.h>
#include <c10/core/GeneratorImpl.h>

namespace neuron {

class NeuronGeneratorImpl final : public c10::GeneratorImpl {
 public:
  explicit NeuronGeneratorImpl(c10::DeviceIndex device, uint64_t seed);

  void set_current_seed(uint64_t seed) override;
  void set_offset(uint64_t offset) override;
  uint64_t get_offset() const override;
  uint64_t current_seed() const override;
  uint64_t seed() override;
  void set_state(const c10::TensorImpl& new_state) override;
  c10::intrusive_ptr<c10::TensorImpl> get_state() const override;
  static c10::DeviceType device_type() { return c10::DeviceType::PrivateUse1; }

  // The host-side engine the kernels draw from (a CPU generator object holding this
  // core's state).
  const at::Generator& engine() const { return engine_; }

 private:
  NeuronGeneratorImpl* clone_impl() const override;
  at::Generator engine_;
};

// The default generator of a core (created on first use).
const at::Generator& defaultGenerator(c10::DeviceIndex device);
at::Generator makeGenerator(c10::DeviceIndex device);

}  // namespace neuron
