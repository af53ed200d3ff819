// Pinned host allocations, tracked by address range so interior pointers are recognised.
#include "runtime/NeuronHostAllocator.h"

#include <c10/util/Exception.h>

#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>

namespace neuron {
namespace {

std::mutex g_mutex;
std::map<uintptr_t, size_t>& pinnedBlocks() {
  static auto* blocks = new std::map<uintptr_t, size_t>();
  return *blocks;
}

void freePinned(void* ptr) {
  {
    std::lock_guard<std::mutex> lock(g_mutex);
    pinnedBlocks().erase(reinterpret_cast<uintptr_t>(ptr));
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
    std::lock_guard<std::mutex> lock(g_mutex);
    pinnedBlocks()[reinterpret_cast<uintptr_t>(ptr)] = nbytes;
  }
  return {ptr, ptr, &freePinned, c10::Device(c10::DeviceType::CPU)};
}

c10::DeleterFnPtr NeuronHostAllocator::raw_deleter() const {
  return &freePinned;
}

void NeuronHostAllocator::copy_data(void* dest, const void* src, std::size_t count) const {
  std::memcpy(dest, src, count);
}

bool NeuronHostAllocator::isPinned(const void* ptr) const {
  const auto p = reinterpret_cast<uintptr_t>(ptr);
  std::lock_guard<std::mutex> lock(g_mutex);
  auto& blocks = pinnedBlocks();
  auto it = blocks.upper_bound(p);
  if (it == blocks.begin()) return false;
  --it;
  return p < it->first + it->second;
}

NeuronHostAllocator& hostAllocator() {
  static NeuronHostAllocator allocator;
  return allocator;
}

}  // namespace neuron
