// backplane.Error and one subclass per Errc, and the translation of every C++
// exception that leaves the core into them: Python never sees a crash or a
// bare RuntimeError, and `.code` says which Errc it was.
#include "common.hpp"

#include <array>
#include <cstring>
#include <new>
#include <string_view>

namespace backplane::python {
namespace {

struct ErrorClass {
  Errc code;
  const char* name;
  PyObject* builtin;  // a standard exception to derive from as well, so `except ValueError` works; or null
};

// The Python class name of each code and the builtin it also is.
std::array<ErrorClass, 17> error_classes() {
  return {{
      {Errc::invalid_argument, "InvalidArgument", PyExc_ValueError},
      {Errc::config_error, "ConfigError", nullptr},
      {Errc::not_found, "NotFound", PyExc_LookupError},
      {Errc::plugin_load_failed, "PluginLoadFailed", nullptr},
      {Errc::abi_mismatch, "AbiMismatch", nullptr},
      {Errc::backend_unavailable, "BackendUnavailable", nullptr},
      {Errc::capability_missing, "CapabilityMissing", nullptr},
      {Errc::unsupported_op, "UnsupportedOp", nullptr},
      {Errc::shape_mismatch, "ShapeMismatch", PyExc_ValueError},
      {Errc::dtype_mismatch, "DtypeMismatch", PyExc_TypeError},
      {Errc::device_mismatch, "DeviceMismatch", PyExc_ValueError},
      {Errc::out_of_memory, "OutOfMemory", PyExc_MemoryError},
      {Errc::device_error, "DeviceError", nullptr},
      {Errc::timeout, "Timeout", PyExc_TimeoutError},
      {Errc::collective_error, "CollectiveError", nullptr},
      {Errc::io_error, "IoError", PyExc_OSError},
      {Errc::internal, "InternalError", nullptr},
  }};
}

// The classes, indexed by Errc value; owned by the module (strong references
// taken at import and never released: the module lives until the process ends).
PyObject* g_base = nullptr;
std::array<PyObject*, 18> g_by_code{};

PyObject* class_for(Errc code) {
  const auto i = static_cast<std::size_t>(code);
  return i < g_by_code.size() && g_by_code[i] != nullptr ? g_by_code[i] : g_base;
}

// Raises cls(message) with .code set to `code`. The message may quote bytes
// from a file or a plugin that are not UTF-8: they show as \xNN rather than
// turning the error into a UnicodeDecodeError.
void raise(Errc code, const char* message) {
  PyObject* cls = class_for(code);
  py::object text = py::reinterpret_steal<py::object>(
      PyUnicode_DecodeUTF8(message, static_cast<Py_ssize_t>(std::strlen(message)), "backslashreplace"));
  if (!text) return;  // no memory for it: that error is set
  py::object instance =
      py::reinterpret_steal<py::object>(PyObject_CallFunctionObjArgs(cls, text.ptr(), nullptr));
  if (!instance) return;  // the constructor failed: its error is already set
  try {
    instance.attr("code") = py::cast(code);
  } catch (py::error_already_set& e) {
    e.restore();
    return;
  }
  PyErr_SetObject(cls, instance.ptr());
}

}  // namespace

py::str text(std::string_view s) {
  PyObject* out = PyUnicode_DecodeUTF8(s.data(), static_cast<Py_ssize_t>(s.size()), "backslashreplace");
  if (out == nullptr) throw py::error_already_set();
  return py::reinterpret_steal<py::str>(out);
}

py::str path_text(std::string_view s) {
  PyObject* out = PyUnicode_DecodeFSDefaultAndSize(s.data(), static_cast<Py_ssize_t>(s.size()));
  if (out == nullptr) throw py::error_already_set();
  return py::reinterpret_steal<py::str>(out);
}

std::string utf8(py::handle s, const std::string& what) {
  if (!PyUnicode_Check(s.ptr()))
    throw py::type_error(what + " must be a str, not " + py::str(py::type::of(s)).cast<std::string>());
  Py_ssize_t size = 0;
  const char* data = PyUnicode_AsUTF8AndSize(s.ptr(), &size);
  if (data != nullptr) return std::string(data, static_cast<std::size_t>(size));
  PyErr_Clear();
  // Only a lone surrogate (U+D800..U+DFFF) has no UTF-8 form: os.fsdecode and
  // errors="surrogateescape" make them of bytes that were not UTF-8.
  Py_ssize_t at = 0;
  const Py_ssize_t n = PyUnicode_GetLength(s.ptr());
  while (at < n) {
    const Py_UCS4 c = PyUnicode_ReadChar(s.ptr(), at);
    if (c >= 0xD800 && c <= 0xDFFF) break;
    ++at;
  }
  const py::object shown = py::reinterpret_steal<py::object>(PyObject_ASCII(s.ptr()));  // as ascii() shows it
  if (!shown) throw py::error_already_set();
  throw Error(Errc::invalid_argument, what + " " + shown.cast<std::string>() +
                                          " is not valid text: it holds a lone surrogate at index " +
                                          std::to_string(at) +
                                          " (what errors=\"surrogateescape\" or os.fsdecode make of bytes "
                                          "that are not UTF-8), which UTF-8 cannot encode; pass valid text");
}

void bind_errors(py::module_& m) {
  py::enum_<Errc>(m, "Errc", "The error codes of backplane::Errc; Error.code holds one")
      .value("invalid_argument", Errc::invalid_argument)
      .value("config_error", Errc::config_error)
      .value("not_found", Errc::not_found)
      .value("plugin_load_failed", Errc::plugin_load_failed)
      .value("abi_mismatch", Errc::abi_mismatch)
      .value("backend_unavailable", Errc::backend_unavailable)
      .value("capability_missing", Errc::capability_missing)
      .value("unsupported_op", Errc::unsupported_op)
      .value("shape_mismatch", Errc::shape_mismatch)
      .value("dtype_mismatch", Errc::dtype_mismatch)
      .value("device_mismatch", Errc::device_mismatch)
      .value("out_of_memory", Errc::out_of_memory)
      .value("device_error", Errc::device_error)
      .value("timeout", Errc::timeout)
      .value("collective_error", Errc::collective_error)
      .value("io_error", Errc::io_error)
      .value("internal", Errc::internal)
      .def("__str__", [](Errc c) { return std::string(to_string(c)); });

  // class Error(Exception): code = None (set on every raised instance).
  g_base = PyErr_NewExceptionWithDoc("backplane.Error",
                                     "Base class of every backplane error; .code is the backplane.Errc",
                                     PyExc_Exception, nullptr);
  if (g_base == nullptr) throw py::error_already_set();
  PyObject_SetAttrString(g_base, "code", Py_None);
  m.add_object("Error", py::handle(g_base), /*overwrite=*/true);
  for (const ErrorClass& c : error_classes()) {
    const std::string qualified = std::string("backplane.") + c.name;
    py::tuple bases = c.builtin != nullptr ? py::make_tuple(py::handle(g_base), py::handle(c.builtin))
                                           : py::make_tuple(py::handle(g_base));
    const std::string doc = std::string("backplane::Errc::") + to_string(c.code);
    PyObject* cls = PyErr_NewExceptionWithDoc(qualified.c_str(), doc.c_str(), bases.ptr(), nullptr);
    if (cls == nullptr) throw py::error_already_set();
    g_by_code[static_cast<std::size_t>(c.code)] = cls;
    m.add_object(c.name, py::handle(cls), /*overwrite=*/true);
  }

  // Local to this module: pybind11's translators are shared by every module
  // built with the same pybind11, torch's own among them, and a global one
  // would turn torch's RuntimeErrors into backplane errors.
  py::register_local_exception_translator([](std::exception_ptr p) {
    try {
      if (p) std::rethrow_exception(p);
    } catch (const Error& e) {
      raise(e.code(), e.what());
    } catch (const py::builtin_exception&) {
      throw;  // pybind11's own (TypeError for a bad argument, StopIteration, ...)
    } catch (const py::error_already_set&) {
      throw;
    } catch (const std::bad_alloc&) {
      raise(Errc::out_of_memory, "out of memory (std::bad_alloc)");
    } catch (const std::exception& e) {
      // Anything else from C++ (a std::runtime_error from a library) is still
      // a backplane.Error, never a bare RuntimeError.
      raise(Errc::internal, e.what());
    }
  });
}

}  // namespace backplane::python
