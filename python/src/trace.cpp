// bp.trace and bp.trace_range: a region of a Python program recorded into a
// Trace Event Format file, and a span of the program's own, through the
// core's trace::Session and trace::Range (include/backplane/trace.hpp).
#include "common.hpp"

#include <backplane/trace.hpp>

#include <pybind11/stl.h>
#include <pybind11/stl/filesystem.h>

#include <filesystem>
#include <memory>
#include <optional>
#include <string>

namespace backplane::python {
namespace {

// `with bp.trace(path):` records from __enter__ to __exit__.
class TraceContext {
 public:
  TraceContext(const std::filesystem::path& path, std::optional<uint64_t> max_events) {
    options_.path = path.string();
    if (max_events) options_.max_events = *max_events;
  }
  void enter() {
    if (session_) throw Error(Errc::invalid_argument, "trace: this bp.trace is already recording");
    session_ = std::make_unique<trace::Session>(options_);
  }
  void exit() {
    if (!session_) return;
    std::unique_ptr<trace::Session> s = std::move(session_);
    nogil([&] { s->stop(); });  // rank 0 may wait for the other ranks' parts
  }

 private:
  trace::Options options_;
  std::unique_ptr<trace::Session> session_;
};

// `with bp.trace_range(name):` a span on this thread around what it contains.
class RangeContext {
 public:
  explicit RangeContext(std::string name) : name_(std::move(name)) {}
  void enter() { range_.emplace(name_); }
  void exit() { range_.reset(); }

 private:
  std::string name_;
  std::optional<trace::Range> range_;
};

}  // namespace

void bind_trace(py::module_& m) {
  py::class_<TraceContext>(
      m, "trace",
      "Records every op, op fallback, copy and collective of this process into a Trace "
      "Event Format file (Perfetto, chrome://tracing, speedscope) while the with block "
      "runs; each rank of a job writes PATH.rank<R>.part and rank 0 merges them into PATH")
      .def(py::init<const std::filesystem::path&, std::optional<uint64_t>>(), py::arg("path"),
           py::arg("max_events") = py::none())
      .def("__enter__", [](TraceContext& c) { c.enter(); })
      .def("__exit__", [](TraceContext& c, py::args) {
        c.exit();
        return false;
      });
  py::class_<RangeContext>(m, "trace_range",
                           "A named span of the program's own in the trace, around the with block")
      .def(py::init([](py::handle name) {
             return std::make_unique<RangeContext>(utf8(name, "trace_range: the name"));
           }),
           py::arg("name"))
      .def("__enter__", [](RangeContext& c) { c.enter(); })
      .def("__exit__", [](RangeContext& c, py::args) {
        c.exit();
        return false;
      });
  m.def("trace_active", &trace::active,
        "Whether a trace records in this process (bp.trace or BACKPLANE_TRACE)");
}

}  // namespace backplane::python
