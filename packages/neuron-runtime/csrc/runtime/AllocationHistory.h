// What torch.neuron.memory._record_memory_history records, as CUDA's caching allocator does:
// the stack of every live block and a bounded history of allocator actions (alloc, free,
// segment alloc/free, OOM), each with the time and, if asked, the stack that caused it.
// Off by default; when off, the allocator's only cost is one relaxed atomic load per call.
#pragma once

#include <c10/core/Allocator.h>

#include <atomic>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

namespace neuron {

enum class HistoryAction : uint8_t {
  Alloc,
  FreeRequested,
  FreeCompleted,
  SegmentAlloc,
  SegmentFree,
  Oom,
  Snapshot,
};

// The names torch.cuda.memory's snapshots use ("alloc", "free_requested", ...).
const char* historyActionName(HistoryAction action);

struct HistoryEntry {
  HistoryAction action;
  c10::DeviceIndex device;
  uintptr_t address;  // 0 for an OOM
  size_t size;
  size_t device_free;  // OOM only: what the core had left
  int64_t time_us;
  std::shared_ptr<c10::GatheredContext> context;  // the stack, or null
};

// Which stacks are kept, as torch.cuda.memory._record_memory_history's `context` argument.
enum class StackContext : uint8_t { None, State, Alloc, All };

struct HistorySettings {
  bool enabled = false;         // record anything at all ("state" or "all")
  bool keep_history = false;    // "all": keep the action history, not only live stacks
  StackContext context = StackContext::None;
  bool cpp_stacks = false;      // stacks="all": also C++ frames
  size_t max_entries = SIZE_MAX;  // per core
  std::vector<HistoryAction> skipped;
};

class AllocationHistory {
 public:
  // Applies new settings; clear drops the recorded history (also done when disabling).
  void configure(const HistorySettings& settings, bool clear);
  bool enabled() const noexcept { return enabled_.load(std::memory_order_relaxed); }

  // The caller's stack for an allocation (kept with the live block), or null. Call without
  // holding allocator locks: gathering Python frames takes the GIL.
  std::shared_ptr<c10::GatheredContext> stackForAlloc();
  // The caller's stack for a free, or null (only with context "all").
  std::shared_ptr<c10::GatheredContext> stackForFree();
  // Keeps `entry` if the history is on (an alloc entry keeps its stack only with context
  // "alloc" or "all"; with "state" the stack stays with the live block alone).
  void record(HistoryEntry entry);
  // Every kept entry of every core, per core.
  std::vector<std::vector<HistoryEntry>> entries();

 private:
  // The caller's stack if the current settings keep stacks at `least`, else null.
  std::shared_ptr<c10::GatheredContext> stackIfContext(StackContext least);

  std::mutex mutex_;
  std::atomic<bool> enabled_{false};
  HistorySettings settings_;
  std::vector<std::deque<HistoryEntry>> entries_;  // per core, oldest first
};

AllocationHistory& allocationHistory();

}  // namespace neuron
