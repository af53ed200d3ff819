// A c10d::Backend implemented by a Python object.
#pragma once

#include <torch/csrc/distributed/c10d/Backend.hpp>
#include <torch/csrc/utils/pybind.h>

#include <string>
#include <unordered_map>
#include <vector>

namespace neuron_dist {

// torch's ProcessGroup routes every collective through the c10d dispatcher ops (c10d::allreduce_
// and friends), whose device kernels call the Backend registered for the tensors' device. A
// Python ProcessGroup subclass skips those ops (so dispatch modes such as CommDebugMode, the
// profiler's records and fake tracing never see its collectives), and torch offers no Python
// subclassable Backend. This class is that Backend: each virtual forwards, under the GIL, to the
// method of the same collective on `impl` (neuron_dist.ProcessGroupNeuron), whose Python work
// handle is wrapped in a PythonWork. It owns `impl`; `impl` never refers back, so there is no
// reference cycle and the transport closes when torch drops the group.
class PythonBackend : public c10d::Backend {
 public:
  PythonBackend(int rank, int size, pybind11::object impl, std::string name);
  ~PythonBackend() override;
  PythonBackend(const PythonBackend&) = delete;
  PythonBackend& operator=(const PythonBackend&) = delete;

  const pybind11::object& impl() const {
    return impl_;
  }

  const std::string getBackendName() const override {
    return name_;
  }
  bool supportsCoalescing() const override {
    return true;
  }
  // Splitting (torch.distributed.split_group; DeviceMesh uses it when the default group is bound
  // to a core with init_process_group(device_id=...)) makes a new neuron group of the ranks.
  bool supportsSplitting() const override {
    return true;
  }
  c10::intrusive_ptr<Options> getBackendOptions() override;
  // ProcessGroup.set_timeout / torch.distributed's _set_pg_timeout: the timeout of later collectives.
  void setTimeout(std::chrono::milliseconds timeout) override;
  c10::intrusive_ptr<c10d::Backend> split(
      const c10::intrusive_ptr<c10d::Store>& store,
      const std::vector<int>& ranks,
      const c10::intrusive_ptr<Options>& opts) override;
  void setGroupUid(const std::string& pg_uid) override;
  void startCoalescing() override;
  c10::intrusive_ptr<c10d::Work> endCoalescing() override;

  c10::intrusive_ptr<c10d::Work> broadcast(
      std::vector<at::Tensor>& tensors,
      const c10d::BroadcastOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> allreduce(
      std::vector<at::Tensor>& tensors,
      const c10d::AllreduceOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> allreduce_coalesced(
      std::vector<at::Tensor>& tensors,
      const c10d::AllreduceCoalescedOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> reduce(
      std::vector<at::Tensor>& tensors,
      const c10d::ReduceOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> allgather(
      std::vector<std::vector<at::Tensor>>& outputs,
      std::vector<at::Tensor>& inputs,
      const c10d::AllgatherOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> _allgather_base(
      at::Tensor& output,
      at::Tensor& input,
      const c10d::AllgatherOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> allgather_coalesced(
      std::vector<std::vector<at::Tensor>>& outputs,
      std::vector<at::Tensor>& inputs,
      const c10d::AllgatherOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> allgather_into_tensor_coalesced(
      std::vector<at::Tensor>& outputs,
      std::vector<at::Tensor>& inputs,
      const c10d::AllgatherOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> gather(
      std::vector<std::vector<at::Tensor>>& outputs,
      std::vector<at::Tensor>& inputs,
      const c10d::GatherOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> scatter(
      std::vector<at::Tensor>& outputs,
      std::vector<std::vector<at::Tensor>>& inputs,
      const c10d::ScatterOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> reduce_scatter(
      std::vector<at::Tensor>& outputs,
      std::vector<std::vector<at::Tensor>>& inputs,
      const c10d::ReduceScatterOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> _reduce_scatter_base(
      at::Tensor& output,
      at::Tensor& input,
      const c10d::ReduceScatterOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> reduce_scatter_tensor_coalesced(
      std::vector<at::Tensor>& outputs,
      std::vector<at::Tensor>& inputs,
      const c10d::ReduceScatterOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> alltoall_base(
      at::Tensor& output,
      at::Tensor& input,
      std::vector<int64_t>& outputSplitSizes,
      std::vector<int64_t>& inputSplitSizes,
      const c10d::AllToAllOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> alltoall(
      std::vector<at::Tensor>& outputs,
      std::vector<at::Tensor>& inputs,
      const c10d::AllToAllOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> send(
      std::vector<at::Tensor>& tensors,
      int dstRank,
      int tag) override;
  c10::intrusive_ptr<c10d::Work> recv(
      std::vector<at::Tensor>& tensors,
      int srcRank,
      int tag) override;
  c10::intrusive_ptr<c10d::Work> recvAnysource(
      std::vector<at::Tensor>& tensors,
      int tag) override;
  c10::intrusive_ptr<c10d::Work> barrier(
      const c10d::BarrierOptions& opts) override;
  void monitoredBarrier(const c10d::BarrierOptions& opts, bool waitAllRanks)
      override;

  void setSequenceNumberForGroup() override;
  uint64_t getSequenceNumberForGroup() override;
  void abort() override;
  void shutdown() override;

 private:
  // Calls impl.<method>(args...) and wraps the Python work it returns.
  template <typename... Args>
  c10::intrusive_ptr<c10d::Work> forward(const char* method, const Args&... args);

  pybind11::object impl_;
  const std::string name_;
  // The group split off under each name: torch may ask once per device type this backend serves
  // (neuron and CPU), and both must get the same group. Weak: the child lives as long as torch
  // holds it.
  std::unordered_map<std::string, c10::weak_intrusive_ptr<PythonBackend>> splits_;
};

} // namespace neuron_dist
