// Python bindings of neuron_dist._C: the PythonBackend type torch's ProcessGroup can hold.
#include "BackendOptions.h"
#include "PythonBackend.h"

#include <pybind11/chrono.h>
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
          "The Python object that implements the collectives.")
      .def(
          "perform_nocolor_split",
          [](neuron_dist::PythonBackend& /* self */, const c10::Device& /* device */) {},
          py::arg("device"),
          "Nothing to do: torch calls this on the ranks left out of a new_group of a group bound to a "
          "device whose backend splits (NCCL's communicator split needs every rank); a neuron split "
          "involves only the new group's ranks.")
      .def(
          "_set_default_timeout",
          [](neuron_dist::PythonBackend& self, std::chrono::milliseconds timeout) { self.setTimeout(timeout); },
          py::arg("timeout"),
          "The timeout of collectives issued from now on, as ProcessGroupGloo._set_default_timeout.")
      .def_property_readonly(
          "options", [](neuron_dist::PythonBackend& self) { return self.getBackendOptions(); },
          "The group's options (timeout, name, global ranks), as ProcessGroupGloo.options.");
  py::class_<neuron_dist::BackendOptions, c10d::Backend::Options, c10::intrusive_ptr<neuron_dist::BackendOptions>>(
      m, "BackendOptions", "torch's Backend.Options, copyable (split_group deep-copies a parent's options).")
      .def("__copy__", [](const neuron_dist::BackendOptions& self) {
        return c10::make_intrusive<neuron_dist::BackendOptions>(self);
      })
      .def(
          "__deepcopy__",
          [](const neuron_dist::BackendOptions& self, const py::dict& /* memo */) {
            return c10::make_intrusive<neuron_dist::BackendOptions>(self);
          },
          py::arg("memo"));
}
