// Entering the Python implementation from a c10d virtual: the GIL, with torch.compile's frame
// hook turned off.
#pragma once

#include <torch/csrc/utils/pybind.h>

namespace neuron_dist {

// Holds the GIL and, while alive, turns off Dynamo's frame evaluation hook. The backend's
// Python code is its implementation, as gloo's C++ is gloo's: a collective issued between
// compiled graphs (DDP's buffer broadcast at the start of a compiled forward) must run it as
// is. With the hook on, Dynamo traced each of its frames as user code, graph-broke on its
// internals and recompiled on every call (its sequence counter changes every call).
class PythonCall {
 public:
  PythonCall() : previous_(setEvalFrame()(pybind11::none())) {}
  ~PythonCall() {
    try {
      setEvalFrame()(previous_);
    } catch (...) {  // a destructor must not throw; the hook stays off, which is safe
    }
  }
  PythonCall(const PythonCall&) = delete;
  PythonCall& operator=(const PythonCall&) = delete;

 private:
  static pybind11::handle setEvalFrame() {
    // Looked up once and kept for the life of the process (never released at exit).
    static pybind11::handle function = pybind11::object(
        pybind11::module_::import("torch._C").attr("_dynamo").attr("eval_frame").attr("set_eval_frame")).release();
    return function;
  }

  pybind11::gil_scoped_acquire gil_;  // declared first: held while previous_ is set and restored
  pybind11::object previous_;
};

} // namespace neuron_dist
