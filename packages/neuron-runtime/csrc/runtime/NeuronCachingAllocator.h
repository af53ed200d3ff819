// The neuron caching allocator: every byte of emulated HBM goes through it. It enforces the
// per-core capacity of the emulated instance (raising torch.OutOfMemoryError like CUDA) and
// keeps CUDA-style statistics, so torch.neuron.memory_* and torch.accelerator.memory_* work.
#pragma once

#include <c10/core/CachingDeviceAllocator.h>

#include <cstdint>
#include <memory>
#include <vector>

namespace neuron {

// One segment of a core's memory as torch.neuron.memory_snapshot() reports it. The allocator
// never splits segments; a live segment's rest past `allocated` is what the statistics count
// as an inactive split (CUDA would split it off as a block of its own).
struct SegmentSnapshot {
  c10::DeviceIndex device;
  uintptr_t address;
  size_t size;
  size_t requested;  // 0 when the block is cached (inactive)
  size_t allocated;  // the request rounded as the statistics count it; 0 when cached
  bool active;
  bool small;
  std::shared_ptr<c10::GatheredContext> stack;  // where the live block was allocated, if recorded
};

class NeuronCachingAllocator final : public c10::DeviceAllocator {
 public:
  // Allocates on the calling thread's current core.
  c10::DataPtr allocate(size_t nbytes) override;
  // Allocates on an explicit core.
  c10::DataPtr allocateOn(size_t nbytes, c10::DeviceIndex device);
  c10::DeleterFnPtr raw_deleter() const override;
  void copy_data(void* dest, const void* src, std::size_t count) const override;

  bool initialized() override;
  void emptyCache(c10::MempoolId_t mempool_id = {0, 0}) override;
  void recordStream(const c10::DataPtr& ptr, c10::Stream stream) override;
  c10::CachingDeviceAllocator::DeviceStats getDeviceStats(c10::DeviceIndex device) override;
  void resetAccumulatedStats(c10::DeviceIndex device) override;
  void resetPeakStats(c10::DeviceIndex device) override;
  // (free, total) bytes of the core's emulated HBM.
  std::pair<size_t, size_t> getMemoryInfo(c10::DeviceIndex device) override;

  // Caps what the process may reserve on a core at fraction x capacity
  // (torch.cuda.set_per_process_memory_fraction); 1.0 lifts the cap.
  void setMemoryFraction(double fraction, c10::DeviceIndex device);
  double memoryFraction(c10::DeviceIndex device);
  // Every segment of every core, ordered by address.
  std::vector<SegmentSnapshot> snapshot();

  // The core that owns a pointer into neuron memory, or -1.
  c10::DeviceIndex deviceOfPointer(const void* ptr) const;
};

// The process-wide allocator instance (also registered as c10::GetAllocator(PrivateUse1)).
NeuronCachingAllocator& cachingAllocator();

// The deleter every neuron DataPtr carries; lets callers recognise neuron memory.
void deleteNeuronMemory(void* ptr);

}  // namespace neuron
