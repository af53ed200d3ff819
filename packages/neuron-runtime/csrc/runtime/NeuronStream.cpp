// Stream identities, priorities and the per-thread current stream.
#include "runtime/NeuronStream.h"

#include "driver/DeviceState.h"

#include <c10/util/Exception.h>

#include <atomic>
#include <mutex>
#include <unordered_map>
#include <vector>

namespace neuron {
namespace {

std::atomic<int64_t> g_next_stream_id{1};  // 0 is each device's default stream
std::mutex g_mutex;
std::unordered_map<int64_t, int>& priorities() {
  static auto* map = new std::unordered_map<int64_t, int>();
  return *map;
}
thread_local std::vector<int64_t> t_current_ids;  // per device; 0 = default stream

int64_t& currentIdSlot(c10::DeviceIndex device) {
  if (t_current_ids.size() <= static_cast<size_t>(device)) {
    t_current_ids.resize(static_cast<size_t>(device) + 1, 0);
  }
  return t_current_ids[static_cast<size_t>(device)];
}

c10::Stream makeStream(c10::DeviceIndex device, int64_t id) {
  return c10::Stream(c10::Stream::UNSAFE, c10::Device(c10::DeviceType::PrivateUse1, device), id);
}

}  // namespace

c10::Stream defaultStream(c10::DeviceIndex device) {
  checkDeviceIndex(device);
  return makeStream(device, 0);
}

c10::Stream currentStream(c10::DeviceIndex device) {
  checkDeviceIndex(device);
  return makeStream(device, currentIdSlot(device));
}

c10::Stream exchangeStream(c10::Stream stream) {
  const auto device = stream.device_index();
  checkDeviceIndex(device);
  int64_t& slot = currentIdSlot(device);
  const c10::Stream previous = makeStream(device, slot);
  slot = stream.id();
  return previous;
}

c10::Stream newStream(c10::DeviceIndex device, int priority) {
  checkDeviceIndex(device);
  TORCH_CHECK(priority >= kHighestStreamPriority - 99 && priority <= kLowestStreamPriority + 99,
              "neuron: invalid stream priority ", priority);
  const int clamped = std::max(kHighestStreamPriority, std::min(kLowestStreamPriority, priority));
  const int64_t id = g_next_stream_id.fetch_add(1);
  {
    std::lock_guard<std::mutex> lock(g_mutex);
    priorities()[id] = clamped;
  }
  return makeStream(device, id);
}

int streamPriority(c10::Stream stream) {
  std::lock_guard<std::mutex> lock(g_mutex);
  auto it = priorities().find(stream.id());
  return it == priorities().end() ? 0 : it->second;
}

}  // namespace neuron
