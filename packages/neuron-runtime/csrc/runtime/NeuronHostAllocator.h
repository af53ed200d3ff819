// Pinned ("page-locked") host memory for neuron: what Tensor.pin_memory() and DataLoader's
// pin_memory=True allocate, and what is_pinned() recognises. Registered as PyTorch's host
// allocator for the device, so torch.accelerator.empty_host_cache() and the host memory
// statistics reach it.
#pragma once

#include <ATen/core/CachingHostAllocator.h>

namespace neuron {

class NeuronHostAllocator final : public at::HostAllocator {
 public:
  c10::DataPtr allocate(size_t nbytes) override;
  c10::DeleterFnPtr raw_deleter() const override;
  void copy_data(void* dest, const void* src, std::size_t count) const override;

  // Copies run synchronously on the host, so a pinned block is never in use by a stream.
  bool record_event(void* ptr, void* ctx, c10::Stream stream) override;
  // Blocks are returned to the host when freed; there is no cache to empty.
  void empty_cache() override;
  at::HostStats get_stats() override;
  void reset_accumulated_stats() override;
  void reset_peak_stats() override;

  // True if ptr points into a live pinned block.
  bool isPinned(const void* ptr) const;
};

NeuronHostAllocator& hostAllocator();

}  // namespace neuron
