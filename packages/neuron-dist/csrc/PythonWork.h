// A c10d::Work whose every query is answered by a Python work object.
#pragma once

#include <torch/csrc/distributed/c10d/Work.hpp>
#include <torch/csrc/utils/pybind.h>

namespace neuron_dist {

// torch's own PyWorkHolder forwards only wait() and getFuture(); the handles that
// dist.all_reduce(..., async_op=True) returns must also answer is_completed(), is_success(),
// exception(), source_rank() and result() from the Python work that did the collective.
class PythonWork : public c10d::Work {
 public:
  explicit PythonWork(pybind11::object work);
  ~PythonWork() override;
  PythonWork(const PythonWork&) = delete;
  PythonWork& operator=(const PythonWork&) = delete;

  bool wait(std::chrono::milliseconds timeout = kNoTimeout) override;
  bool isCompleted() override;
  bool isSuccess() const override;
  std::exception_ptr exception() const override;
  int sourceRank() const override;
  std::vector<at::Tensor> result() override;
  void synchronize() override;
  c10::intrusive_ptr<c10::ivalue::Future> getFuture() override;

 private:
  pybind11::object work_;
};

} // namespace neuron_dist
