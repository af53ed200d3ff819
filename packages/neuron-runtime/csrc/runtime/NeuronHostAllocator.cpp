// Pinned host allocations, tracked by address range so interior pointers are recognised.
#include "runtime/NeuronHostAllocator.h"

#include <c10/util/Exception.h>

#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>

namespace neuron {
namespace {

struct PinnedState {
  std::mutex mutex;
  std::map<uintptr_t, size_t> blocks;  // start -> size
  at::HostStats stats;
};

PinnedState& pinned() {
  // Leaked on purpose: pinned tensors may be freed during interpreter teardown.
  static auto* state = new PinnedState();
  return *state;
}

void freePinned(void* ptr) {
  if (ptr == nullptr) return;
  {
    PinnedState& s = pinned();
    std::lock_guard<std::mutex> lock(s.mutex);
    auto it = s.blocks.find(reinterpret_cast<uintptr_t>(ptr));
    if (it != s.blocks.end()) {
      const auto size = static_cast<int64_t>(it->second);
      s.stats.active_requests.decrease(1);
      s.stats.active_bytes.decrease(size);
      s.stats.allocations.decrease(1);
      s.stats.allocated_bytes.decrease(size);
      s.stats.num_host_free += 1;
      s.blocks.erase(it);
    }
  }
  std::free(ptr);
}

}  // namespace

c10::DataPtr NeuronHostAllocator::allocate(size_t nbytes) {
  if (nbytes == 0) {
    return {nullptr, nullptr, &freePinned, c10::Device(c10::DeviceType::CPU)};
  }
  void* ptr = nullptr;
  TORCH_CHECK_WITH(OutOfMemoryError, posix_memalign(&ptr, 64, nbytes) == 0,
                   "neuron: could not allocate ", nbytes, " bytes of pinned host memory.");
  {
    PinnedState& s = pinned();
    std::lock_guard<std::mutex> lock(s.mutex);
    s.blocks[reinterpret_cast<uintptr_t>(ptr)] = nbytes;
    const auto size = static_cast<int64_t>(nbytes);
    s.stats.active_requests.increase(1);
    s.stats.active_bytes.increase(size);
    s.stats.allocations.increase(1);
    s.stats.allocated_bytes.increase(size);
    s.stats.num_host_alloc += 1;
  }
  return {ptr, ptr, &freePinned, c10::Device(c10::DeviceType::CPU)};
}

c10::DeleterFnPtr NeuronHostAllocator::raw_deleter() const {
  return &freePinned;
}

void NeuronHostAllocator::copy_data(void* dest, const void* src, std::size_t count) const {
  std::memcpy(dest, src, count);
}

bool NeuronHostAllocator::record_event(void* /*ptr*/, void* /*ctx*/, c10::Stream /*stream*/) {
  return true;
}

void NeuronHostAllocator::empty_cache() {}

at::HostStats NeuronHostAllocator::get_stats() {
  PinnedState& s = pinned();
  std::lock_guard<std::mutex> lock(s.mutex);
  return s.stats;
}

void NeuronHostAllocator::reset_accumulated_stats() {
  PinnedState& s = pinned();
  std::lock_guard<std::mutex> lock(s.mutex);
  for (auto* stat : {&s.stats.active_requests, &s.stats.active_bytes, &s.stats.allocations,
                     &s.stats.allocated_bytes}) {
    stat->reset_accumulated();
  }
  s.stats.num_host_alloc = 0;
  s.stats.num_host_free = 0;
}

void NeuronHostAllocator::reset_peak_stats() {
  PinnedState& s = pinned();
  std::lock_guard<std::mutex> lock(s.mutex);
  for (auto* stat : {&s.stats.active_requests, &s.stats.active_bytes, &s.stats.allocations,
                     &s.stats.allocated_bytes}) {
    stat->reset_peak();
  }
}

bool NeuronHostAllocator::isPinned(const void* ptr) const {
  const auto p = reinterpret_cast<uintptr_t>(ptr);
  PinnedState& s = pinned();
  std::lock_guard<std::mutex> lock(s.mutex);
  auto it = s.blocks.upper_bound(p);
  if (it == s.blocks.begin()) return false;
  --it;
  return p < it->first + it->second;
}

NeuronHostAllocator& hostAllocator() {
  static NeuronHostAllocator allocator;
  return allocator;
}

namespace {
struct RegisterHostAllocator {
  RegisterHostAllocator() {
    at::setHostAllocator(c10::DeviceType::PrivateUse1, &hostAllocator());
  }
} register_host_allocator;
}  // namespace

}  // namespace neuron
