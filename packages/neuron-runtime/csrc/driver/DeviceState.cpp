// Device count, per-thread current device, lazy init and the bad-fork guard.
#include "driver/DeviceState.h"

#include "driver/RuntimeConfig.h"

#include <c10/core/AutogradState.h>
#include <c10/util/Exception.h>

#include <atomic>
#include <mutex>
#include <pthread.h>

namespace neuron {
namespace {

std::atomic<bool> g_initialized{false};
std::atomic<bool> g_in_bad_fork{false};
thread_local c10::DeviceIndex t_current_device = -1;

void markChildAsBadFork() {
  if (g_initialized.load()) {
    g_in_bad_fork.store(true);
  }
}

}  // namespace

c10::DeviceIndex deviceCount() noexcept {
  const auto& config = runtimeConfig();
  return config.error.empty() ? static_cast<c10::DeviceIndex>(config.device_count) : 0;
}

void checkDeviceIndex(c10::DeviceIndex index) {
  checkRuntimeConfig();
  const auto count = deviceCount();
  TORCH_CHECK(
      index >= 0 && index < count,
      "Invalid device index neuron:", static_cast<int>(index), ": this emulated ",
      runtimeConfig().instance, " instance has ", static_cast<int>(count),
      " visible NeuronCore(s), so valid indices are 0..", static_cast<int>(count) - 1,
      ". Use torch.neuron.device_count() to check, or change NEURON_RT_NUM_CORES / "
      "NEURON_RT_VISIBLE_CORES.");
}

c10::DeviceIndex currentDevice() {
  if (t_current_device < 0) {
    const auto initial = static_cast<c10::DeviceIndex>(runtimeConfig().initial_device);
    t_current_device = (initial >= 0 && initial < deviceCount()) ? initial : 0;
  }
  return t_current_device;
}

void setCurrentDevice(c10::DeviceIndex index) {
  checkDeviceIndex(index);
  t_current_device = index;
}

void lazyInitDevice() {
  if (g_in_bad_fork.load()) {
    TORCH_CHECK(
        false,
        // Worded as torch.cuda's error, which PyTorch's own tests match.
        "Cannot re-initialize neuron in forked subprocess. To use neuron with "
        "multiprocessing, you must use the 'spawn' start method "
        "(multiprocessing.set_start_method('spawn') or "
        "DataLoader(multiprocessing_context='spawn')), or not touch the device in the "
        "child: the parent process had already initialized the neuron runtime.");
  }
  if (g_initialized.load(std::memory_order_acquire)) {
    return;
  }
  static std::once_flag once;
  std::call_once(once, [] {
    checkRuntimeConfig();
    TORCH_CHECK(deviceCount() > 0, "neuron: no NeuronCores are visible (NEURON_RT_NUM_CORES=0?).");
    pthread_atfork(nullptr, nullptr, &markChildAsBadFork);
    if (runtimeConfig().backward_on_calling_thread) {
      // The device is host code: PyTorch's per-device autograd thread would only add a second
      // OpenMP team fighting this thread's for the cores. Thread-local, as
      // torch.autograd.set_multithreading_enabled(False) is.
      c10::AutogradState::get_tls_state().set_multithreading_enabled(false);
    }
    g_initialized.store(true, std::memory_order_release);
  });
}

bool isInitialized() noexcept {
  return g_initialized.load() && !g_in_bad_fork.load();
}

bool isInBadFork() noexcept {
  return g_in_bad_fork.load();
}

}  // namespace neuron
