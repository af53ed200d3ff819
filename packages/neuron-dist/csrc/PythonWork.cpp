// PythonWork: forwards c10d::Work's virtual queries to the Python work object.
#include "PythonWork.h"

#include "PythonCall.h"
#include "PythonGil.h"

#include <pybind11/chrono.h>
#include <torch/csrc/autograd/python_variable.h>
#include <torch/csrc/jit/python/pybind_utils.h>

namespace py = pybind11;

namespace neuron_dist {

PythonWork::PythonWork(py::object work) : work_(std::move(work)) {}

PythonWork::~PythonWork() {
  releasePythonObject(work_);
}

bool PythonWork::wait(std::chrono::milliseconds timeout) {
  PythonCall call;
  if (timeout == kNoTimeout) {
    return work_.attr("wait")().cast<bool>();
  }
  return work_.attr("wait")(timeout).cast<bool>();
}

bool PythonWork::isCompleted() {
  PythonCall call;
  return work_.attr("is_completed")().cast<bool>();
}

bool PythonWork::isSuccess() const {
  PythonCall call;
  return work_.attr("is_success")().cast<bool>();
}

std::exception_ptr PythonWork::exception() const {
  PythonCall call;
  py::object error = work_.attr("exception")();
  if (error.is_none()) {
    return nullptr;
  }
  return std::make_exception_ptr(std::runtime_error(py::str(error).cast<std::string>()));
}

int PythonWork::sourceRank() const {
  PythonCall call;
  return work_.attr("source_rank")().cast<int>();
}

std::vector<at::Tensor> PythonWork::result() {
  PythonCall call;
  py::object value = work_.attr("result")();
  if (py::isinstance<py::list>(value) || py::isinstance<py::tuple>(value)) {
    // Results of list collectives nest (one list per input); flatten like gloo's works do.
    std::vector<at::Tensor> flat;
    for (const auto& item : value) {
      if (py::isinstance<py::list>(item) || py::isinstance<py::tuple>(item)) {
        for (const auto& inner : item) {
          flat.push_back(inner.cast<at::Tensor>());
        }
      } else {
        flat.push_back(item.cast<at::Tensor>());
      }
    }
    return flat;
  }
  return {value.cast<at::Tensor>()};
}

void PythonWork::synchronize() {
  PythonCall call;
  work_.attr("synchronize")();
}

namespace {

// A Python exception a torch.futures.Future holds as its value (set_exception, or an error in a
// then() callback): only the Python wrapper that stored it raises it; through a Work it must be
// the future's error, so that wait() raises it.
std::exception_ptr pythonExceptionValue(const c10::IValue& value) {
  if (!value.isPyObject()) {
    return nullptr;
  }
  py::gil_scoped_acquire gil;
  py::handle object(value.toPyObject());
  if (!PyExceptionInstance_Check(object.ptr())) {
    return nullptr;
  }
  const std::string type = py::str(py::type::handle_of(object).attr("__name__"));
  return std::make_exception_ptr(std::runtime_error(type + ": " + std::string(py::str(object))));
}

// A Python list or tuple of tensors (a collective's result) as the TensorList that c10d's own
// works complete their futures with: C++ callers such as DDP's built-in FP16_COMPRESS hook
// require one. Any other value is passed on as it is.
c10::IValue asTensorList(const c10::IValue& value) {
  if (!value.isPyObject()) {
    return value;
  }
  py::gil_scoped_acquire gil;
  py::handle object(value.toPyObject());
  if (!PyList_Check(object.ptr()) && !PyTuple_Check(object.ptr())) {
    return value;
  }
  std::vector<at::Tensor> tensors;
  for (py::handle item : py::reinterpret_borrow<py::sequence>(object)) {
    if (!THPVariable_Check(item.ptr())) {
      return value;
    }
    tensors.push_back(THPVariable_Unpack(item.ptr()));
  }
  return c10::IValue(std::move(tensors));
}

}  // namespace

c10::intrusive_ptr<c10::ivalue::Future> PythonWork::getFuture() {
  PythonCall call;
  py::object future = work_.attr("get_future")();
  auto inner = future.cast<std::shared_ptr<torch::jit::PythonFutureWrapper>>()->fut;
  // Typed as gloo's and NCCL's works type theirs: a list of tensors.
  auto outer = c10::make_intrusive<c10::ivalue::Future>(c10::ListType::create(c10::TensorType::get()),
                                                        inner->devices());
  inner->addCallback([outer](c10::ivalue::Future& done) {
    if (done.hasError()) {
      outer->setError(done.exception_ptr());
    } else if (auto error = pythonExceptionValue(done.constValue())) {
      outer->setError(error);
    } else {
      outer->markCompleted(asTensorList(done.constValue()), done.storages());
    }
  });
  return outer;
}

} // namespace neuron_dist
