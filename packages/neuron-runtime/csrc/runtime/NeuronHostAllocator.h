// Pinned ("page-locked") host memory for neuron: what Tensor.pin_memory() and DataLoader's
// pin_memory=True allocate, and what is_pinned() recognises.
#pragma once

#include <c10/core/Allocator.h>

namespace neuron {

class NeuronHostAllocator final : public c10::Allocator {
 public:
  c10::DataPtr allocate(size_t nbytes) override;
  c10::DeleterFnPtr raw_deleter() const override;
  void copy_data(void* dest, const void* src, std::size_t count) const override;
  // True if ptr points into a live pinned block.
  bool isPinned(const void* ptr) const;
};

NeuronHostAllocator& hostAllocator();

}  // namespace neuron
