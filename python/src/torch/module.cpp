// backplane._backplane_torch: the PyTorch bridge's extension module. It
// exposes ProcessGroupBackplane (a c10d::ProcessGroup) to Python; the
// package's backplane/torch.py registers it with torch.distributed as the
// backend "backplane". Built against libtorch 1.13 (Debian's libtorch-dev).
#include "process_group.hpp"

#include <pybind11/chrono.h>
#include <pybind11/pybind11.h>
#include <torch/csrc/utils/pybind.h>  // c10::intrusive_ptr as a pybind11 holder

namespace py = pybind11;
using backplane::torch_bridge::ProcessGroupBackplane;

PYBIND11_MODULE(_backplane_torch, m) {
  m.doc() =
      "The c10d process group behind torch.distributed's \"backplane\" backend (import backplane.torch)";
  // c10d's Store and ProcessGroup types must be registered before ours derives.
  py::module_::import("torch.distributed");

  py::class_<ProcessGroupBackplane, c10d::ProcessGroup, c10::intrusive_ptr<ProcessGroupBackplane>>(
      m, "ProcessGroupBackplane",
      "torch.distributed's collectives on backplane's communicators (made by init_process_group)")
      .def(py::init([](const c10::intrusive_ptr<c10d::Store>& store, int rank, int size,
                       std::chrono::milliseconds timeout, const backplane::Registry& registry) {
             return c10::make_intrusive<ProcessGroupBackplane>(store, rank, size, timeout, registry);
           }),
           py::arg("store"), py::arg("rank"), py::arg("size"), py::arg("timeout"), py::arg("registry"),
           py::call_guard<py::gil_scoped_release>(),
           "Joins the group through `store` (blocks until every rank arrived or `timeout`)")
      .def("target", &ProcessGroupBackplane::describe_target, py::arg("device_type") = "cpu",
           "The backplane device that serves torch tensors of `device_type` (\"cpu\", \"cuda\")");
}
