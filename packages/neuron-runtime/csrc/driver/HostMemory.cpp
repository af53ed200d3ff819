#include "driver/HostMemory.h"

#include <algorithm>
#include <cstdint>
#include <fstream>
#include <string>

namespace neuron {
namespace {

size_t memAvailable() {
  std::ifstream meminfo("/proc/meminfo");
  std::string key;
  size_t kib = 0;
  std::string unit;
  while (meminfo >> key >> kib >> unit) {
    if (key == "MemAvailable:") return kib * 1024;
  }
  return SIZE_MAX;
}

// A number from a one-line cgroup file; SIZE_MAX if absent or "max" (no limit).
size_t cgroupValue(const char* path) {
  std::ifstream file(path);
  std::string text;
  if (!(file >> text) || text == "max") return SIZE_MAX;
  try {
    return static_cast<size_t>(std::stoull(text));
  } catch (...) {
    return SIZE_MAX;
  }
}

size_t cgroupHeadroom() {
  const size_t limit = cgroupValue("/sys/fs/cgroup/memory.max");
  const size_t current = cgroupValue("/sys/fs/cgroup/memory.current");
  if (limit == SIZE_MAX || current == SIZE_MAX) return SIZE_MAX;
  return limit > current ? limit - current : 0;
}

}  // namespace

size_t hostAvailableBytes() {
  return std::min(memAvailable(), cgroupHeadroom());
}

}  // namespace neuron
