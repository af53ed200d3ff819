// Allocation history for torch.neuron.memory._record_memory_history (see the header).
#include "runtime/AllocationHistory.h"

#include <torch/csrc/profiler/combined_traceback.h>

#include <algorithm>
#include <chrono>

namespace neuron {

const char* historyActionName(HistoryAction action) {
  switch (action) {
    case HistoryAction::Alloc: return "alloc";
    case HistoryAction::FreeRequested: return "free_requested";
    case HistoryAction::FreeCompleted: return "free_completed";
    case HistoryAction::SegmentAlloc: return "segment_alloc";
    case HistoryAction::SegmentFree: return "segment_free";
    case HistoryAction::Oom: return "oom";
    case HistoryAction::Snapshot: return "snapshot";
  }
  return "unknown";
}

void AllocationHistory::configure(const HistorySettings& settings, bool clear) {
  std::lock_guard<std::mutex> lock(mutex_);
  settings_ = settings;
  if (clear || !settings.enabled) entries_.clear();
  for (auto& kept : entries_) {
    while (kept.size() > settings.max_entries) kept.pop_front();
  }
  enabled_.store(settings.enabled, std::memory_order_relaxed);
}

std::shared_ptr<c10::GatheredContext> AllocationHistory::stackIfContext(StackContext least) {
  if (!enabled()) return nullptr;
  bool cpp = false;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (settings_.context < least) return nullptr;
    cpp = settings_.cpp_stacks;
  }
  // Outside the lock: gathering Python frames takes the GIL.
  return torch::CapturedTraceback::gather(/*python=*/true, /*script=*/true, cpp);
}

std::shared_ptr<c10::GatheredContext> AllocationHistory::stackForAlloc() {
  return stackIfContext(StackContext::State);
}

std::shared_ptr<c10::GatheredContext> AllocationHistory::stackForFree() {
  return stackIfContext(StackContext::All);
}

void AllocationHistory::record(HistoryEntry entry) {
  if (!enabled()) return;
  std::lock_guard<std::mutex> lock(mutex_);
  if (!settings_.keep_history || settings_.max_entries == 0) return;
  const auto& skipped = settings_.skipped;
  if (std::find(skipped.begin(), skipped.end(), entry.action) != skipped.end()) return;
  if (entry.action == HistoryAction::Alloc && settings_.context < StackContext::Alloc) entry.context = nullptr;
  entry.time_us = std::chrono::duration_cast<std::chrono::microseconds>(
                      std::chrono::system_clock::now().time_since_epoch())
                      .count();
  const auto device = static_cast<size_t>(std::max<c10::DeviceIndex>(entry.device, 0));
  if (entries_.size() <= device) entries_.resize(device + 1);
  auto& kept = entries_[device];
  if (kept.size() >= settings_.max_entries) kept.pop_front();
  kept.push_back(std::move(entry));
}

std::vector<std::vector<HistoryEntry>> AllocationHistory::entries() {
  std::lock_guard<std::mutex> lock(mutex_);
  std::vector<std::vector<HistoryEntry>> result;
  result.reserve(entries_.size());
  for (const auto& kept : entries_) result.emplace_back(kept.begin(), kept.end());
  return result;
}

AllocationHistory& allocationHistory() {
  // Leaked on purpose, like the allocator: blocks may be freed during interpreter teardown.
  static auto* instance = new AllocationHistory();
  return *instance;
}

}  // namespace neuron
