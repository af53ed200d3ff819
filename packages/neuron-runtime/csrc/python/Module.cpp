// Python bindings of the runtime (neuron_runtime._C). Thin: each function forwards to the
// runtime; the Python package builds the torch.neuron API on top.
#include "aten/HostViews.h"
#include "aten/OpAccounting.h"
#include "aten/TensorBasics.h"
#include "driver/DeviceState.h"
#include "driver/HostMemory.h"
#include "driver/RuntimeConfig.h"
#include "runtime/AllocationHistory.h"
#include "runtime/NeuronCachingAllocator.h"
#include "runtime/NeuronGenerator.h"
#include "runtime/NeuronHostAllocator.h"
#include "runtime/NeuronStream.h"

#include <torch/csrc/Generator.h>
#include <torch/csrc/profiler/combined_traceback.h>
#include <torch/extension.h>

namespace py = pybind11;

namespace torch {
// Declared in torch/csrc/profiler/python/combined_traceback.h, which needs nlohmann/json, a
// header torch's wheel does not ship; the function itself is exported by libtorch_python.
TORCH_API std::vector<pybind11::object> py_symbolize(std::vector<CapturedTraceback*>& to_symbolize);
}  // namespace torch

namespace neuron {
namespace {

py::dict statDict(const c10::CachingAllocator::Stat& stat) {
  py::dict result;
  result["current"] = stat.current;
  result["peak"] = stat.peak;
  result["allocated"] = stat.allocated;
  result["freed"] = stat.freed;
  return result;
}

py::dict statArray(const c10::CachingAllocator::StatArray& array) {
  static const char* names[] = {"all", "small_pool", "large_pool"};
  py::dict result;
  for (size_t i = 0; i < array.size(); ++i) result[names[i]] = statDict(array[i]);
  return result;
}

// The same nested layout as torch.cuda.memory_stats_as_nested_dict().
py::dict memoryStats(c10::DeviceIndex device) {
  const auto stats = cachingAllocator().getDeviceStats(device);
  py::dict result;
  result["num_alloc_retries"] = stats.num_alloc_retries;
  result["num_ooms"] = stats.num_ooms;
  result["max_split_size"] = stats.max_split_size;
  result["num_sync_all_streams"] = stats.num_sync_all_streams;
  result["num_device_alloc"] = stats.num_device_alloc;
  result["num_device_free"] = stats.num_device_free;
  result["oversize_allocations"] = statDict(stats.oversize_allocations);
  result["oversize_segments"] = statDict(stats.oversize_segments);
  result["allocation"] = statArray(stats.allocation);
  result["segment"] = statArray(stats.segment);
  result["active"] = statArray(stats.active);
  result["inactive_split"] = statArray(stats.inactive_split);
  result["allocated_bytes"] = statArray(stats.allocated_bytes);
  result["reserved_bytes"] = statArray(stats.reserved_bytes);
  result["active_bytes"] = statArray(stats.active_bytes);
  result["inactive_split_bytes"] = statArray(stats.inactive_split_bytes);
  result["requested_bytes"] = statArray(stats.requested_bytes);
  return result;
}

// Symbolizes recorded stacks in one batch (as torch.cuda's snapshot does): one frame list
// per stack, an empty list where nothing was recorded.
std::vector<py::object> symbolizeStacks(const std::vector<c10::GatheredContext*>& stacks) {
  std::vector<torch::CapturedTraceback*> captured;
  std::vector<size_t> index(stacks.size(), SIZE_MAX);
  for (size_t i = 0; i < stacks.size(); ++i) {
    if (auto* traceback = dynamic_cast<torch::CapturedTraceback*>(stacks[i])) {
      index[i] = captured.size();
      captured.push_back(traceback);
    }
  }
  std::vector<py::object> symbolized =
      captured.empty() ? std::vector<py::object>{} : torch::py_symbolize(captured);
  std::vector<py::object> result;
  result.reserve(stacks.size());
  for (size_t i = 0; i < stacks.size(); ++i) {
    result.push_back(index[i] == SIZE_MAX ? py::object(py::list()) : symbolized[index[i]]);
  }
  return result;
}

// One entry per segment, in the layout of torch.cuda.memory_snapshot(); a live block's frames
// are the stack that allocated it, when _record_memory_history recorded one.
py::list memorySnapshot() {
  const std::vector<SegmentSnapshot> snapshot = cachingAllocator().snapshot();
  std::vector<c10::GatheredContext*> stacks;
  for (const SegmentSnapshot& segment : snapshot) stacks.push_back(segment.stack.get());
  const std::vector<py::object> frames = symbolizeStacks(stacks);
  py::list segments;
  for (size_t i = 0; i < snapshot.size(); ++i) {
    const SegmentSnapshot& segment = snapshot[i];
    // The live block, then the rest of the segment as the inactive split the stats count.
    py::list blocks;
    const size_t first = segment.active ? segment.allocated : segment.size;
    py::dict block;
    block["address"] = segment.address;
    block["size"] = first;
    block["requested_size"] = segment.requested;
    block["state"] = segment.active ? "active_allocated" : "inactive";
    block["frames"] = frames[i];
    blocks.append(block);
    if (first < segment.size) {
      py::dict rest;
      rest["address"] = segment.address + first;
      rest["size"] = segment.size - first;
      rest["requested_size"] = 0;
      rest["state"] = "inactive";
      rest["frames"] = py::list();
      blocks.append(rest);
    }
    py::dict entry;
    entry["device"] = static_cast<int>(segment.device);
    entry["address"] = segment.address;
    entry["total_size"] = segment.size;
    entry["allocated_size"] = segment.allocated;
    entry["active_size"] = segment.allocated;
    entry["requested_size"] = segment.requested;
    entry["stream"] = 0;
    entry["segment_type"] = segment.small ? "small" : "large";
    entry["segment_pool_id"] = py::make_tuple(0, 0);
    entry["is_expandable"] = false;
    entry["frames"] = frames[i];
    entry["blocks"] = blocks;
    segments.append(entry);
  }
  return segments;
}

HistoryAction historyActionNamed(const std::string& name) {
  for (auto action : {HistoryAction::Alloc, HistoryAction::FreeRequested, HistoryAction::FreeCompleted,
                      HistoryAction::SegmentAlloc, HistoryAction::SegmentFree, HistoryAction::Oom,
                      HistoryAction::Snapshot}) {
    if (name == historyActionName(action)) return action;
  }
  TORCH_CHECK_VALUE(false, "Unknown action in skip_actions: '", name,
                    "'. Valid actions: alloc, free_requested, free_completed, segment_alloc, "
                    "segment_free, oom, snapshot.");
}

// torch.cuda.memory._record_memory_history's arguments, validated as CUDA validates them.
void recordMemoryHistory(const std::optional<std::string>& enabled, const std::optional<std::string>& context,
                         const std::string& stacks, size_t max_entries, bool clear_history,
                         const std::vector<std::string>& skip_actions) {
  TORCH_CHECK_VALUE(!enabled || *enabled == "state" || *enabled == "all",
                    "enabled must be None, 'state' or 'all', got '", enabled.value_or(""), "'");
  TORCH_CHECK_VALUE(!context || *context == "state" || *context == "alloc" || *context == "all",
                    "context must be None, 'state', 'alloc' or 'all', got '", context.value_or(""), "'");
  TORCH_CHECK_VALUE(stacks == "python" || stacks == "all", "stacks must be 'python' or 'all', got '", stacks, "'");
  HistorySettings settings;
  settings.enabled = enabled.has_value();
  settings.keep_history = enabled && *enabled == "all";
  settings.context = !context ? StackContext::None
                     : *context == "state" ? StackContext::State
                     : *context == "alloc" ? StackContext::Alloc
                                           : StackContext::All;
  settings.cpp_stacks = stacks == "all";
  settings.max_entries = max_entries;
  for (const std::string& name : skip_actions) settings.skipped.push_back(historyActionNamed(name));
  allocationHistory().configure(settings, clear_history);
}

// The recorded actions, one list per core, in the layout of torch.cuda.memory._snapshot()'s
// "device_traces".
py::list memoryHistory(int device_count) {
  const auto kept = allocationHistory().entries();
  std::vector<c10::GatheredContext*> stacks;
  for (const auto& entries : kept) {
    for (const HistoryEntry& entry : entries) stacks.push_back(entry.context.get());
  }
  const std::vector<py::object> frames = symbolizeStacks(stacks);
  py::list traces;
  size_t next = 0;
  for (size_t device = 0; device < std::max(kept.size(), static_cast<size_t>(device_count)); ++device) {
    py::list trace;
    if (device < kept.size()) {
      for (const HistoryEntry& entry : kept[device]) {
        py::dict item;
        item["action"] = historyActionName(entry.action);
        item["addr"] = entry.address;
        item["size"] = entry.size;
        item["stream"] = 0;
        item["time_us"] = entry.time_us;
        item["frames"] = frames[next++];
        if (entry.action == HistoryAction::Oom) item["device_free"] = entry.device_free;
        trace.append(item);
      }
    }
    traces.append(trace);
  }
  return traces;
}

// The same nested layout as torch.cuda.host_memory_stats_as_nested_dict().
py::dict hostMemoryStats() {
  const at::HostStats stats = hostAllocator().get_stats();
  py::dict result;
  result["active_requests"] = statDict(stats.active_requests);
  result["active_bytes"] = statDict(stats.active_bytes);
  result["allocations"] = statDict(stats.allocations);
  result["allocated_bytes"] = statDict(stats.allocated_bytes);
  result["num_host_alloc"] = stats.num_host_alloc;
  result["num_host_free"] = stats.num_host_free;
  return result;
}

void configure(const std::string& instance, int64_t device_count, int64_t capacity_bytes,
               int64_t initial_device, int float64_policy, const std::string& error,
               bool backward_on_calling_thread) {
  RuntimeConfig config;
  config.instance = instance;
  config.device_count = device_count;
  config.capacity_bytes = capacity_bytes;
  config.initial_device = initial_device;
  config.float64 = static_cast<Float64Policy>(float64_policy);
  config.error = error;
  config.backward_on_calling_thread = backward_on_calling_thread;
  setRuntimeConfig(std::move(config));
}

c10::SmallVector<int64_t, 8> intTuple(py::handle sequence, const char* what) {
  TORCH_CHECK(PyTuple_Check(sequence.ptr()) || PyList_Check(sequence.ptr()),
              "_empty_strided: ", what, " must be a tuple or list of ints");
  const py::sequence items = py::reinterpret_borrow<py::sequence>(sequence);
  c10::SmallVector<int64_t, 8> values;
  values.reserve(items.size());
  for (const auto item : items) {
    const long long value = PyLong_AsLongLong(item.ptr());
    if (value == -1 && PyErr_Occurred()) {
      throw py::error_already_set();
    }
    values.push_back(value);
  }
  return values;
}

// torch.empty_strided(size, stride, dtype=dtype, device="neuron") for compiled programs, which
// allocate every buffer through it (Inductor's CPU programs use a C++ fast path the same way).
at::Tensor emptyStrided(py::handle size, py::handle stride, c10::ScalarType dtype) {
  const auto sizes = intTuple(size, "size");
  const auto strides = intTuple(stride, "stride");
  TORCH_CHECK(sizes.size() == strides.size(), "_empty_strided: size has ", sizes.size(),
              " dimensions but stride has ", strides.size());
  return emptyStridedOnCurrentCore(sizes, strides, dtype);
}

py::object defaultGeneratorObject(c10::DeviceIndex device) {
  return py::reinterpret_steal<py::object>(THPGenerator_initDefaultGenerator(defaultGenerator(device)));
}

}  // namespace
}  // namespace neuron

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  using namespace neuron;
  m.doc() = "C++ runtime of the emulated Trainium device.";
  installAllocationRedirect();
  registerDirectFallbacks();

  m.def("_configure", &configure, "Install the emulated instance's configuration.");
  m.def("_device_count", []() { return static_cast<int>(deviceCount()); });
  m.def("_current_device", []() { return static_cast<int>(currentDevice()); });
  m.def("_set_device", [](int index) { setCurrentDevice(static_cast<c10::DeviceIndex>(index)); });
  m.def("_check_device_index", [](int index) { checkDeviceIndex(static_cast<c10::DeviceIndex>(index)); });
  m.def("_lazy_init", &lazyInitDevice);
  m.def("_empty_strided", &emptyStrided, py::arg("size"), py::arg("stride"), py::arg("dtype"));
  m.def("_is_initialized", &isInitialized);
  m.def("_is_in_bad_fork", &isInBadFork);

  m.def("_memory_stats", [](int device) { return memoryStats(static_cast<c10::DeviceIndex>(device)); });
  m.def("_empty_cache", []() { cachingAllocator().emptyCache(); });
  m.def("_reset_peak_stats", [](int device) { cachingAllocator().resetPeakStats(static_cast<c10::DeviceIndex>(device)); });
  m.def("_reset_accumulated_stats", [](int device) {
    cachingAllocator().resetAccumulatedStats(static_cast<c10::DeviceIndex>(device));
  });
  m.def("_set_memory_fraction", [](double fraction, int device) {
    cachingAllocator().setMemoryFraction(fraction, static_cast<c10::DeviceIndex>(device));
  });
  m.def("_get_memory_fraction", [](int device) {
    return cachingAllocator().memoryFraction(static_cast<c10::DeviceIndex>(device));
  });
  m.def("_memory_snapshot", &memorySnapshot);
  m.def("_record_memory_history", &recordMemoryHistory, py::arg("enabled"), py::arg("context"),
        py::arg("stacks"), py::arg("max_entries"), py::arg("clear_history"), py::arg("skip_actions"));
  m.def("_memory_history", &memoryHistory, py::arg("device_count"));
  m.def("_record_memory_snapshot_taken", [](int device) {
    allocationHistory().record({HistoryAction::Snapshot, static_cast<c10::DeviceIndex>(device), 0, 0, 0, 0, nullptr});
  });
  m.def("_host_memory_stats", &hostMemoryStats);
  m.def("_reset_host_peak_stats", []() { hostAllocator().reset_peak_stats(); });
  m.def("_reset_host_accumulated_stats", []() { hostAllocator().reset_accumulated_stats(); });
  // RAM the host can still back emulated HBM with (see HostMemory.h); emulator-only.
  m.def("_host_available_bytes", []() { return static_cast<uint64_t>(hostAvailableBytes()); });
  m.def("_mem_get_info", [](int device) { return cachingAllocator().getMemoryInfo(static_cast<c10::DeviceIndex>(device)); });

  m.def("_default_generator", [](int device) { return defaultGeneratorObject(static_cast<c10::DeviceIndex>(device)); });
  m.def("_stream_priority", [](int64_t stream_id, int device) {
    return streamPriority(c10::Stream(c10::Stream::UNSAFE,
                                      c10::Device(c10::DeviceType::PrivateUse1, static_cast<c10::DeviceIndex>(device)),
                                      stream_id));
  });

  m.def("_copy_fallback_ops", &copyFallbackCounts);
  m.def("_float64_ops", &float64Counts);
  m.def("_zero_copy_ops", &zeroCopyCounts);
  m.def("_reset_op_counts", &resetOpCounts);
  m.def("_set_float64_exempt", &setFloat64Exempt);
  m.def("_set_op_metrics_enabled", &setOpMetricsEnabled);
}
