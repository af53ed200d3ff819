// Python bindings of neuron_dist._C: the PythonBackend type torch's ProcessGroup can hold.
#include "PythonBackend.h"

#include <torch/extension.h>

namespace py = pybind11;

PYBIND11_MODULE(_C, m) {
  // PythonBackend derives from torch's Backend binding, which torch.distributed registers.
  py::module_::import("torch.distributed");
  py::class_<neuron_dist::PythonBackend, c10d::Backend, c10::intrusive_ptr<neuron_dist::PythonBackend>>(
      m, "PythonBackend", "A torch.distributed Backend whose collectives a Python object implements.")
      .def(
          py::init([](int rank, int size, py::object impl, std::string name) {
            return c10::make_intrusive<neuron_dist::PythonBackend>(rank, size, std::move(impl), std::move(name));
          }),
          py::arg("rank"),
          py::arg("size"),
          py::arg("impl"),
          py::arg("name"))
      .def_property_readonly(
          "impl", [](const neuron_dist::PythonBackend& self) { return self.impl(); },
          "The Python object that implements the collectives.");
}
