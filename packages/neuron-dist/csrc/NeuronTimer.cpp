// DDP's runtime statistics for neuron parameters: a host-clock timer, registered for the device.
//
// DDP's reducer asks c10d's TimerRegistry for a timer of its parameters' device type; without
// one for neuron, every DDP run warned "Time stats are currently only collected for CPU and
// CUDA devices" and recorded no forward/backward/communication times. The emulated device
// runs its kernels synchronously on the host, so host timestamps measure it, as CpuTimer does.
#include <torch/csrc/distributed/c10d/reducer_timer.hpp>

namespace c10d {
namespace {

class NeuronTimer : public Timer {
 public:
  explicit NeuronTimer(c10::Device /*device*/) {}

  std::optional<int64_t> measureDifference(Event start, Event end) override {
    const int64_t start_time = getTimeRef(start);
    const int64_t end_time = getTimeRef(end);
    if (start_time == kUnsetTime || end_time == kUnsetTime || end_time < start_time) {
      return std::nullopt;
    }
    return end_time - start_time;
  }
};

C10_REGISTER_TYPED_CLASS(TimerRegistry, c10::kPrivateUse1, NeuronTimer)

}  // namespace
}  // namespace c10d
