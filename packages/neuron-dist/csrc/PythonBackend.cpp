// PythonBackend: c10d::Backend virtuals forwarded to the Python implementation.
#include "PythonBackend.h"

#include "BackendOptions.h"
#include "PythonCall.h"
#include "PythonGil.h"
#include "PythonWork.h"

#include <pybind11/chrono.h>

namespace py = pybind11;

namespace neuron_dist {

PythonBackend::PythonBackend(int rank, int size, py::object impl, std::string name)
    : Backend(rank, size), impl_(std::move(impl)), name_(std::move(name)) {
  TORCH_CHECK(impl_ && !impl_.is_none(), "neuron: PythonBackend needs an implementation object, got None");
  init();
}

PythonBackend::~PythonBackend() {
  releasePythonObject(impl_);
}

// Every Python object is made and dropped under the GIL (the caller released it). Arguments
// reach Python as copies: a Python work may outlive the C++ call that passed them.
template <typename... Args>
c10::intrusive_ptr<c10d::Work> PythonBackend::forward(const char* method, const Args&... args) {
  PythonCall call;
  py::object work = impl_.attr(method)(py::cast(args, py::return_value_policy::copy)...);
  return c10::make_intrusive<PythonWork>(std::move(work));
}

void PythonBackend::setGroupUid(const std::string& pg_uid) {
  Backend::setGroupUid(pg_uid);
  PythonCall call;
  impl_.attr("_set_group_name")(pg_uid);
}

void PythonBackend::startCoalescing() {
  PythonCall call;
  impl_.attr("_start_coalescing")();
}

c10::intrusive_ptr<c10d::Work> PythonBackend::endCoalescing() {
  return forward("_end_coalescing");
}

c10::intrusive_ptr<c10d::Work> PythonBackend::broadcast(
    std::vector<at::Tensor>& tensors,
    const c10d::BroadcastOptions& opts) {
  return forward("broadcast", tensors, opts);
}

c10::intrusive_ptr<c10d::Work> PythonBackend::allreduce(
    std::vector<at::Tensor>& tensors,
    const c10d::AllreduceOptions& opts) {
  return forward("allreduce", tensors, opts);
}

c10::intrusive_ptr<c10d::Work> PythonBackend::allreduce_coalesced(
    std::vector<at::Tensor>& tensors,
    const c10d::AllreduceCoalescedOptions& opts) {
  return forward("allreduce_coalesced", tensors, opts);
}

c10::intrusive_ptr<c10d::Work> PythonBackend::reduce(
    std::vector<at::Tensor>& tensors,
    const c10d::ReduceOptions& opts) {
  return forward("reduce", tensors, opts);
}

c10::intrusive_ptr<c10d::Work> PythonBackend::allgather(
    std::vector<std::vector<at::Tensor>>& outputs,
    std::vector<at::Tensor>& inputs,
    const c10d::AllgatherOptions& opts) {
  return forward("allgather", outputs, inputs, opts);
}

c10::intrusive_ptr<c10d::Work> PythonBackend::_allgather_base(
    at::Tensor& output,
    at::Tensor& input,
    const c10d::AllgatherOptions& opts) {
  return forward("all_gather_single", output, input, opts);
}

c10::intrusive_ptr<c10d::Work> PythonBackend::allgather_coalesced(
    std::vector<std::vector<at::Tensor>>& outputs,
    std::vector<at::Tensor>& inputs,
    const c10d::AllgatherOptions& opts) {
  return forward("allgather_coalesced", outputs, inputs, opts);
}

c10::intrusive_ptr<c10d::Work> PythonBackend::allgather_into_tensor_coalesced(
    std::vector<at::Tensor>& outputs,
    std::vector<at::Tensor>& inputs,
    const c10d::AllgatherOptions& opts) {
  return forward("all_gather_single_coalesced", outputs, inputs, opts);
}

c10::intrusive_ptr<c10d::Work> PythonBackend::gather(
    std::vector<std::vector<at::Tensor>>& outputs,
    std::vector<at::Tensor>& inputs,
    const c10d::GatherOptions& opts) {
  return forward("gather", outputs, inputs, opts);
}

c10::intrusive_ptr<c10d::Work> PythonBackend::scatter(
    std::vector<at::Tensor>& outputs,
    std::vector<std::vector<at::Tensor>>& inputs,
    const c10d::ScatterOptions& opts) {
  return forward("scatter", outputs, inputs, opts);
}

c10::intrusive_ptr<c10d::Work> PythonBackend::reduce_scatter(
    std::vector<at::Tensor>& outputs,
    std::vector<std::vector<at::Tensor>>& inputs,
    const c10d::ReduceScatterOptions& opts) {
  return forward("reduce_scatter", outputs, inputs, opts);
}

c10::intrusive_ptr<c10d::Work> PythonBackend::_reduce_scatter_base(
    at::Tensor& output,
    at::Tensor& input,
    const c10d::ReduceScatterOptions& opts) {
  return forward("reduce_scatter_single", output, input, opts);
}

c10::intrusive_ptr<c10d::Work> PythonBackend::reduce_scatter_tensor_coalesced(
    std::vector<at::Tensor>& outputs,
    std::vector<at::Tensor>& inputs,
    const c10d::ReduceScatterOptions& opts) {
  return forward("reduce_scatter_single_coalesced", outputs, inputs, opts);
}

c10::intrusive_ptr<c10d::Work> PythonBackend::alltoall_base(
    at::Tensor& output,
    at::Tensor& input,
    std::vector<int64_t>& outputSplitSizes,
    std::vector<int64_t>& inputSplitSizes,
    const c10d::AllToAllOptions& opts) {
  return forward("all_to_all_single", output, input, outputSplitSizes, inputSplitSizes, opts);
}

c10::intrusive_ptr<c10d::Work> PythonBackend::alltoall(
    std::vector<at::Tensor>& outputs,
    std::vector<at::Tensor>& inputs,
    const c10d::AllToAllOptions& opts) {
  return forward("alltoall", outputs, inputs, opts);
}

c10::intrusive_ptr<c10d::Work> PythonBackend::send(std::vector<at::Tensor>& tensors, int dstRank, int tag) {
  return forward("send", tensors, dstRank, tag);
}

c10::intrusive_ptr<c10d::Work> PythonBackend::recv(std::vector<at::Tensor>& tensors, int srcRank, int tag) {
  return forward("recv", tensors, srcRank, tag);
}

c10::intrusive_ptr<c10d::Work> PythonBackend::recvAnysource(std::vector<at::Tensor>& tensors, int tag) {
  return forward("recv_anysource", tensors, tag);
}

c10::intrusive_ptr<c10d::Work> PythonBackend::barrier(const c10d::BarrierOptions& opts) {
  return forward("barrier", opts);
}

void PythonBackend::monitoredBarrier(const c10d::BarrierOptions& opts, bool waitAllRanks) {
  PythonCall call;
  impl_.attr("monitored_barrier")(opts.timeout, waitAllRanks);
}

c10::intrusive_ptr<c10d::Backend::Options> PythonBackend::getBackendOptions() {
  PythonCall call;
  auto options = c10::make_intrusive<BackendOptions>(
      name_, impl_.attr("_timeout").cast<std::chrono::milliseconds>());
  options->group_name = getGroupUid();
  options->group_desc = getGroupDesc();
  options->global_ranks_in_group = impl_.attr("_global_ranks").cast<std::vector<uint64_t>>();
  return options;
}

void PythonBackend::setTimeout(std::chrono::milliseconds timeout) {
  PythonCall call;
  impl_.attr("_set_default_timeout")(timeout);
}

c10::intrusive_ptr<c10d::Backend> PythonBackend::split(
    const c10::intrusive_ptr<c10d::Store>& store,
    const std::vector<int>& ranks,
    const c10::intrusive_ptr<Options>& opts) {
  TORCH_CHECK(opts, "neuron: split_group needs backend options, got none");
  auto known = splits_.find(opts->group_name);
  if (known != splits_.end()) {
    if (auto child = known->second.lock()) {
      return child;
    }
  }
  PythonCall call;
  py::object impl = impl_.attr("_split")(store, ranks, opts->timeout, opts->group_name);
  if (impl.is_none()) {
    return nullptr;  // this rank is in none of the new groups
  }
  auto child = c10::make_intrusive<PythonBackend>(
      impl.attr("rank")().cast<int>(), impl.attr("size")().cast<int>(), std::move(impl), name_);
  splits_.insert_or_assign(opts->group_name, c10::weak_intrusive_ptr<PythonBackend>(child));
  return child;
}

void PythonBackend::setSequenceNumberForGroup() {
  PythonCall call;
  impl_.attr("_set_sequence_number_for_group")();
}

uint64_t PythonBackend::getSequenceNumberForGroup() {
  PythonCall call;
  return impl_.attr("_get_sequence_number_for_group")().cast<uint64_t>();
}

void PythonBackend::abort() {
  PythonCall call;
  impl_.attr("abort")();
}

void PythonBackend::shutdown() {
  PythonCall call;
  impl_.attr("shutdown")();
}

} // namespace neuron_dist
