// Caching allocator over host memory that plays the role of HBM.
//
// Blocks are rounded up (512 B below 1 MiB, 2 MiB above), cached on free and reused by
// best fit (at most twice the request for large blocks, exact size class for small ones).
// Statistics count what CUDA's allocator counts: a tensor's block is its request rounded to
// 512 B (CUDA splits larger blocks to that size), and the rest of a larger block shows as an
// inactive split, reserved but not allocated. This allocator does not reuse that rest, so the
// core's capacity is checked against reserved memory, as CUDA checks it.
// "reserved" is what the emulated core holds from the host; it may never exceed the core's
// capacity. When a request does not fit, the cache is released once and the request retried,
// as CUDA's allocator does, before raising torch.OutOfMemoryError.
#include "runtime/NeuronCachingAllocator.h"

#include "driver/DeviceState.h"
#include "driver/HostMemory.h"
#include "driver/RuntimeConfig.h"
#include "runtime/AllocationHistory.h"

#include <c10/core/Allocator.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <sstream>
#include <unordered_map>
#include <vector>

namespace neuron {
namespace {

using c10::CachingAllocator::StatType;
using c10::CachingDeviceAllocator::DeviceStats;

constexpr size_t kSmallLimit = 1 << 20;    // requests up to 1 MiB come from the small pool
constexpr size_t kSmallRound = 512;
constexpr size_t kLargeRound = 2 << 20;
constexpr size_t kAlignment = 256;
// Segments from this size up are checked against the RAM the host has left (see HostMemory.h).
constexpr size_t kHostCheckBytes = size_t{256} << 20;

struct Block {
  c10::DeviceIndex device;
  size_t size;       // rounded size, what the core holds
  size_t requested;  // what the caller asked for
  bool small;
  std::shared_ptr<c10::GatheredContext> stack;  // where it was allocated, when history is recorded

  // What CUDA's allocator would count as allocated: the request rounded to 512 B.
  size_t allocated() const { return ((requested + kSmallRound - 1) / kSmallRound) * kSmallRound; }
  // The rest of the block, which CUDA would split off as an inactive block.
  size_t split() const { return size - std::min(size, allocated()); }
};

struct CorePool {
  DeviceStats stats;
  std::multimap<size_t, void*> cached;  // free blocks by size
  size_t reserved = 0;
  double fraction = 1.0;  // set_per_process_memory_fraction
};

std::string formatBytes(size_t bytes) {
  std::ostringstream out;
  out.setf(std::ios::fixed);
  out.precision(2);
  const double b = static_cast<double>(bytes);
  if (b >= (1ull << 30)) out << b / (1ull << 30) << " GiB";
  else if (b >= (1ull << 20)) out << b / (1ull << 20) << " MiB";
  else if (b >= (1ull << 10)) out << b / (1ull << 10) << " KiB";
  else out << bytes << " bytes";
  return out.str();
}

// Why the host, not the emulated core, refused: emulated HBM is host RAM.
std::string hostNote(size_t host_available) {
  std::ostringstream note;
  note << " (The host could not provide the memory: the machine running the emulator";
  if (host_available != SIZE_MAX) {
    note << " has " << formatBytes(host_available) << " of RAM left";
  } else {
    note << " is out of RAM";
  }
  note << ", and emulated HBM is host RAM. Lower the emulated capacity with NEURON_EMU_HBM_GIB "
          "so that scripts sizing themselves from it fit this machine.)";
  return note.str();
}

size_t roundSize(size_t nbytes) {
  const size_t unit = nbytes <= kSmallLimit ? kSmallRound : kLargeRound;
  return ((nbytes + unit - 1) / unit) * unit;
}

void updateStats(DeviceStats& stats, const Block& block, bool increase) {
  const auto pool = static_cast<size_t>(block.small ? StatType::SMALL_POOL : StatType::LARGE_POOL);
  const size_t allocated = block.allocated();
  const size_t split = block.split();
  for (size_t type : {static_cast<size_t>(StatType::AGGREGATE), pool}) {
    if (increase) {
      stats.allocation[type].increase(1);
      stats.active[type].increase(1);
      stats.allocated_bytes[type].increase(allocated);
      stats.active_bytes[type].increase(allocated);
      stats.requested_bytes[type].increase(block.requested);
      if (split > 0) {
        stats.inactive_split[type].increase(1);
        stats.inactive_split_bytes[type].increase(split);
      }
    } else {
      stats.allocation[type].decrease(1);
      stats.active[type].decrease(1);
      stats.allocated_bytes[type].decrease(allocated);
      stats.active_bytes[type].decrease(allocated);
      stats.requested_bytes[type].decrease(block.requested);
      if (split > 0) {
        stats.inactive_split[type].decrease(1);
        stats.inactive_split_bytes[type].decrease(split);
      }
    }
  }
}

void updateSegmentStats(DeviceStats& stats, size_t size, bool small, bool increase) {
  const auto pool = static_cast<size_t>(small ? StatType::SMALL_POOL : StatType::LARGE_POOL);
  // Every segment is one allocation from the device (CUDA counts its cudaMalloc/cudaFree calls).
  (increase ? stats.num_device_alloc : stats.num_device_free) += 1;
  for (size_t type : {static_cast<size_t>(StatType::AGGREGATE), pool}) {
    if (increase) {
      stats.segment[type].increase(1);
      stats.reserved_bytes[type].increase(size);
    } else {
      stats.segment[type].decrease(1);
      stats.reserved_bytes[type].decrease(size);
    }
  }
}

// Allocations and frees as torch.profiler's memory events (profile_memory=True), as CUDA's
// caching allocator reports them: the block's size, negative when freed, and the core's totals.
void reportToProfiler(const DeviceStats& stats, void* ptr, const Block& block, bool allocated) {
  if (!c10::memoryProfilingEnabled()) return;
  const auto aggregate = static_cast<size_t>(StatType::AGGREGATE);
  const auto size = static_cast<int64_t>(block.size);
  c10::reportMemoryUsageToProfiler(ptr, allocated ? size : -size, stats.allocated_bytes[aggregate].current,
                                   stats.reserved_bytes[aggregate].current,
                                   c10::Device(c10::DeviceType::PrivateUse1, block.device));
}

// All allocator state, behind one mutex (the emulator executes synchronously, so
// contention is low and one lock keeps the invariants simple).
class AllocatorState {
 public:
  void* allocate(size_t nbytes, c10::DeviceIndex device) {
    lazyInitDevice();
    checkDeviceIndex(device);
    AllocationHistory& history = allocationHistory();
    // Gathered before locking: gathering Python frames takes the GIL.
    auto stack = history.enabled() ? history.stackForAlloc() : nullptr;
    std::lock_guard<std::mutex> lock(mutex_);
    CorePool& pool = poolFor(device);
    const size_t size = roundSize(nbytes);
    const bool small = nbytes <= kSmallLimit;
    size_t block_size = size;
    void* ptr = takeCached(pool, size, small, &block_size);
    if (ptr == nullptr) {
      ptr = newSegment(pool, device, size, nbytes, small, stack);
    }
    Block block{device, block_size, nbytes, small, stack};
    if (history.enabled()) {
      history.record({HistoryAction::Alloc, device, reinterpret_cast<uintptr_t>(ptr), block.allocated(), 0,
                      0, stack});
    }
    const Block& stored = live_.insert_or_assign(ptr, std::move(block)).first->second;
    updateStats(pool.stats, stored, true);
    reportToProfiler(pool.stats, ptr, stored, /*allocated=*/true);
    return ptr;
  }

  void free(void* ptr) {
    if (isInBadFork()) {
      return;  // memory inherited from the parent; the child must not touch its pools
    }
    AllocationHistory& history = allocationHistory();
    auto stack = history.enabled() ? history.stackForFree() : nullptr;
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = live_.find(ptr);
    if (it == live_.end()) {
      return;
    }
    const Block block = std::move(it->second);
    live_.erase(it);
    CorePool& pool = poolFor(block.device);
    updateStats(pool.stats, block, false);
    reportToProfiler(pool.stats, ptr, block, /*allocated=*/false);
    if (history.enabled()) {
      // The emulator runs streams in order, so a freed block is reusable at once.
      const auto address = reinterpret_cast<uintptr_t>(ptr);
      history.record({HistoryAction::FreeRequested, block.device, address, block.allocated(), 0, 0, stack});
      history.record({HistoryAction::FreeCompleted, block.device, address, block.allocated(), 0, 0, stack});
    }
    // Ahead of cached blocks of the same size: the next request of this size reuses the
    // block freed last, whose bytes are still in the host's caches (as malloc reuses them).
    pool.cached.emplace_hint(pool.cached.lower_bound(block.size), block.size, ptr);
  }

  void emptyCache() {
    std::lock_guard<std::mutex> lock(mutex_);
    for (size_t device = 0; device < pools_.size(); ++device) {
      releaseCached(pools_[device]);
    }
  }

  DeviceStats stats(c10::DeviceIndex device) {
    checkDeviceIndex(device);
    std::lock_guard<std::mutex> lock(mutex_);
    return poolFor(device).stats;
  }

  template <typename Fn>
  void forEachStat(c10::DeviceIndex device, Fn fn) {
    checkDeviceIndex(device);
    std::lock_guard<std::mutex> lock(mutex_);
    DeviceStats& s = poolFor(device).stats;
    for (auto* array : {&s.allocation, &s.segment, &s.active, &s.inactive_split,
                        &s.allocated_bytes, &s.reserved_bytes, &s.active_bytes,
                        &s.inactive_split_bytes, &s.requested_bytes}) {
      for (auto& stat : *array) fn(stat);
    }
    fn(s.oversize_allocations);
    fn(s.oversize_segments);
  }

  void resetAccumulated(c10::DeviceIndex device) {
    forEachStat(device, [](c10::CachingAllocator::Stat& stat) { stat.reset_accumulated(); });
    std::lock_guard<std::mutex> lock(mutex_);
    DeviceStats& stats = poolFor(device).stats;
    stats.num_alloc_retries = 0;
    stats.num_ooms = 0;
    stats.num_device_alloc = 0;
    stats.num_device_free = 0;
  }

  void resetPeak(c10::DeviceIndex device) {
    forEachStat(device, [](c10::CachingAllocator::Stat& stat) { stat.reset_peak(); });
  }

  std::pair<size_t, size_t> memoryInfo(c10::DeviceIndex device) {
    checkDeviceIndex(device);
    std::lock_guard<std::mutex> lock(mutex_);
    const size_t capacity = static_cast<size_t>(runtimeConfig().capacity_bytes);
    const size_t reserved = poolFor(device).reserved;
    return {capacity - std::min(capacity, reserved), capacity};
  }

  void setFraction(double fraction, c10::DeviceIndex device) {
    checkDeviceIndex(device);
    std::lock_guard<std::mutex> lock(mutex_);
    poolFor(device).fraction = fraction;
  }

  double fraction(c10::DeviceIndex device) {
    checkDeviceIndex(device);
    std::lock_guard<std::mutex> lock(mutex_);
    return poolFor(device).fraction;
  }

  std::vector<SegmentSnapshot> snapshot() {
    std::lock_guard<std::mutex> lock(mutex_);
    std::vector<SegmentSnapshot> result;
    result.reserve(segments_.size());
    for (const auto& [address, extent] : segments_) {
      const auto live = live_.find(reinterpret_cast<void*>(address));
      const bool active = live != live_.end();
      result.push_back({extent.second, address, extent.first,
                        active ? live->second.requested : 0,
                        active ? std::min(extent.first, live->second.allocated()) : 0, active,
                        extent.first <= kSmallLimit, active ? live->second.stack : nullptr});
    }
    return result;
  }

  c10::DeviceIndex deviceOf(const void* ptr) {
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = segments_.upper_bound(reinterpret_cast<uintptr_t>(ptr));
    if (it == segments_.begin()) return -1;
    --it;
    const auto p = reinterpret_cast<uintptr_t>(ptr);
    return p < it->first + it->second.first ? it->second.second : -1;
  }

 private:
  CorePool& poolFor(c10::DeviceIndex device) {
    if (pools_.size() <= static_cast<size_t>(device)) {
      pools_.resize(static_cast<size_t>(device) + 1);
    }
    return pools_[static_cast<size_t>(device)];
  }

  // A cached block for `size` bytes (its own size in *block_size), or nullptr.
  void* takeCached(CorePool& pool, size_t size, bool small, size_t* block_size) {
    auto it = pool.cached.lower_bound(size);
    if (it == pool.cached.end()) return nullptr;
    if (small ? it->first != size : it->first > 2 * size) return nullptr;
    void* ptr = it->second;
    *block_size = it->first;
    pool.cached.erase(it);
    return ptr;
  }

  void* newSegment(CorePool& pool, c10::DeviceIndex device, size_t size, size_t requested,
                   bool small, const std::shared_ptr<c10::GatheredContext>& stack) {
    const size_t capacity = static_cast<size_t>(runtimeConfig().capacity_bytes);
    const size_t limit = pool.fraction >= 1.0
                             ? capacity
                             : static_cast<size_t>(pool.fraction * static_cast<double>(capacity));
    if (pool.reserved + size > limit && !pool.cached.empty()) {
      pool.stats.num_alloc_retries += 1;
      releaseCached(pool);
    }
    void* ptr = nullptr;
    size_t host_available = SIZE_MAX;
    if (pool.reserved + size <= limit && size >= kHostCheckBytes) {
      host_available = hostAvailableBytes();
      if (size > host_available && !pool.cached.empty()) {  // cached blocks are host memory too
        releaseCached(pool);
        host_available = hostAvailableBytes();
      }
    }
    if (pool.reserved + size <= limit && size <= host_available) {
      if (posix_memalign(&ptr, kAlignment, size) != 0) ptr = nullptr;
    }
    if (ptr == nullptr) {
      pool.stats.num_ooms += 1;
      allocationHistory().record({HistoryAction::Oom, device, 0, requested,
                                  limit - std::min(limit, pool.reserved), 0, stack});
      const size_t allocated = static_cast<size_t>(
          pool.stats.allocated_bytes[static_cast<size_t>(StatType::AGGREGATE)].current);
      const bool host_failed = pool.reserved + size <= limit;
      if (c10::memoryProfilingEnabled()) {
        c10::reportOutOfMemoryToProfiler(
            static_cast<int64_t>(size), allocated,
            static_cast<size_t>(pool.stats.reserved_bytes[static_cast<size_t>(StatType::AGGREGATE)].current),
            c10::Device(c10::DeviceType::PrivateUse1, device));
      }
      std::ostringstream fraction_note;
      if (limit < capacity) {
        fraction_note << " This process may use only " << pool.fraction << " of the core ("
                      << formatBytes(limit)
                      << ", torch.neuron.set_per_process_memory_fraction); it has reserved "
                      << formatBytes(pool.reserved) << ".";
      }
      TORCH_CHECK_WITH(
          OutOfMemoryError, false,
          "NEURON out of memory. Tried to allocate ", formatBytes(requested), ". NeuronCore ",
          static_cast<int>(device), " (neuron:", static_cast<int>(device), ") of this emulated ",
          runtimeConfig().instance, " instance has a total capacity of ", formatBytes(capacity),
          " of which ", formatBytes(capacity - std::min(capacity, pool.reserved)),
          " is free. Of the allocated memory ", formatBytes(allocated),
          " is allocated by PyTorch, and ", formatBytes(pool.reserved - allocated),
          " is reserved by PyTorch but unallocated.", fraction_note.str(),
          host_failed ? hostNote(host_available) : std::string(),
          " Free tensors you no longer need, reduce the batch size or sequence length, or "
          "spread the model over more cores (NEURON_RT_NUM_CORES, tensor parallelism).");
    }
    pool.reserved += size;
    segments_[reinterpret_cast<uintptr_t>(ptr)] = {size, device};
    updateSegmentStats(pool.stats, size, small, true);
    allocationHistory().record(
        {HistoryAction::SegmentAlloc, device, reinterpret_cast<uintptr_t>(ptr), size, 0, 0, stack});
    (void)small;
    return ptr;
  }

  void releaseCached(CorePool& pool) {
    for (auto& [size, ptr] : pool.cached) {
      const auto address = reinterpret_cast<uintptr_t>(ptr);
      allocationHistory().record({HistoryAction::SegmentFree, segments_[address].second, address, size, 0, 0, nullptr});
      segments_.erase(address);
      std::free(ptr);
      pool.reserved -= size;
      updateSegmentStats(pool.stats, size, size <= kSmallLimit, false);
    }
    pool.cached.clear();
  }

  std::mutex mutex_;
  std::vector<CorePool> pools_;
  std::unordered_map<void*, Block> live_;
  std::map<uintptr_t, std::pair<size_t, c10::DeviceIndex>> segments_;  // start -> (size, core)
};

AllocatorState& state() {
  // Leaked on purpose: tensors may be freed during interpreter teardown.
  static auto* instance = new AllocatorState();
  return *instance;
}

}  // namespace

void deleteNeuronMemory(void* ptr) {
  state().free(ptr);
}

c10::DataPtr NeuronCachingAllocator::allocate(size_t nbytes) {
  return allocateOn(nbytes, currentDevice());
}

c10::DataPtr NeuronCachingAllocator::allocateOn(size_t nbytes, c10::DeviceIndex device) {
  const c10::Device where(c10::DeviceType::PrivateUse1, device);
  if (nbytes == 0) {
    lazyInitDevice();
    checkDeviceIndex(device);
    return {nullptr, nullptr, &deleteNeuronMemory, where};
  }
  void* ptr = state().allocate(nbytes, device);
  return {ptr, ptr, &deleteNeuronMemory, where};
}

c10::DeleterFnPtr NeuronCachingAllocator::raw_deleter() const {
  return &deleteNeuronMemory;
}

void NeuronCachingAllocator::copy_data(void* dest, const void* src, std::size_t count) const {
  std::memcpy(dest, src, count);
}

bool NeuronCachingAllocator::initialized() {
  return isInitialized();
}

void NeuronCachingAllocator::emptyCache(c10::MempoolId_t /*mempool_id*/) {
  state().emptyCache();
}

void NeuronCachingAllocator::recordStream(const c10::DataPtr& /*ptr*/, c10::Stream /*stream*/) {
  // Streams execute in order on the host, so a block is never in use by a later stream.
}

c10::CachingDeviceAllocator::DeviceStats NeuronCachingAllocator::getDeviceStats(
    c10::DeviceIndex device) {
  return state().stats(device);
}

void NeuronCachingAllocator::resetAccumulatedStats(c10::DeviceIndex device) {
  state().resetAccumulated(device);
}

void NeuronCachingAllocator::resetPeakStats(c10::DeviceIndex device) {
  state().resetPeak(device);
}

std::pair<size_t, size_t> NeuronCachingAllocator::getMemoryInfo(c10::DeviceIndex device) {
  return state().memoryInfo(device);
}

void NeuronCachingAllocator::setMemoryFraction(double fraction, c10::DeviceIndex device) {
  TORCH_CHECK_VALUE(fraction >= 0.0 && fraction <= 1.0, "Invalid fraction value: ", fraction,
                    ". Allowed range: 0~1");
  state().setFraction(fraction, device);
}

double NeuronCachingAllocator::memoryFraction(c10::DeviceIndex device) {
  return state().fraction(device);
}

std::vector<SegmentSnapshot> NeuronCachingAllocator::snapshot() {
  return state().snapshot();
}

c10::DeviceIndex NeuronCachingAllocator::deviceOfPointer(const void* ptr) const {
  return state().deviceOf(ptr);
}

NeuronCachingAllocator& cachingAllocator() {
  static NeuronCachingAllocator allocator;
  return allocator;
}

namespace {
struct RegisterAllocator {
  RegisterAllocator() {
    c10::SetAllocator(c10::DeviceType::PrivateUse1, &cachingAllocator());
  }
} register_allocator;
}  // namespace

}  // namespace neuron
