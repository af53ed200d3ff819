// Streams and events of the emulated device.
//
// The emulator executes every operation synchronously on the host, in program order, so
// each stream is always complete: record/wait/query/synchronize keep CUDA's semantics
// trivially (work before a record is finished when the record returns). Streams still
// have identities, priorities and a per-thread current stream; events carry timestamps so
// Event.elapsed_time measures real host time between two records.
#pragma once

#include <c10/core/Stream.h>

#include <cstdint>

namespace neuron {

// Priorities follow CUDA: lower is higher priority; 0 is the default, -1 the highest.
constexpr int kLowestStreamPriority = 0;
constexpr int kHighestStreamPriority = -1;

c10::Stream defaultStream(c10::DeviceIndex device);
c10::Stream currentStream(c10::DeviceIndex device);
// Makes `stream` current on its device for the calling thread; returns the previous one.
c10::Stream exchangeStream(c10::Stream stream);
c10::Stream newStream(c10::DeviceIndex device, int priority);
int streamPriority(c10::Stream stream);

// An event: the host time of its last record, and whether it can be timed.
struct EventRecord {
  c10::DeviceIndex device = -1;
  bool enable_timing = false;
  bool recorded = false;
  int64_t time_ns = 0;
};

}  // namespace neuron
