// Releasing Python objects from C++ destructors, which may run while the interpreter shuts down.
#pragma once

#include <torch/csrc/utils/pybind.h>

namespace neuron_dist {

// Drops `object` under the GIL; once the interpreter is finalizing, leaks it instead (taking
// the GIL from a C++ destructor then can hang or crash, and the process is exiting anyway).
inline void releasePythonObject(pybind11::object& object) {
  if (!object) {
    return;
  }
  if (!Py_IsInitialized() || _Py_IsFinalizing()) {
    object.release();
    return;
  }
  pybind11::gil_scoped_acquire gil;
  object = pybind11::object();
}

} // namespace neuron_dist
