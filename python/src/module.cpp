// The extension module backplane._backplane: the registry side of the API
// (Registry, Backend, Device, Capabilities, DType, Op) and the conversions
// from Python values that every other part uses. The tensor, DLPack,
// distributed and nn parts are bound in their own files.
#include "common.hpp"

#include <pybind11/stl/filesystem.h>

#include <algorithm>
#include <cctype>
#include <memory>
#include <string_view>
#include <thread>

namespace backplane::python {
namespace {

// The module object, for the default registry kept in its dict (so the
// registry goes away with the module, not in a static destructor after the
// interpreter is gone).
py::handle g_module;

std::string lower(std::string s) {
  std::transform(s.begin(), s.end(), s.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  return s;
}

std::optional<DType> dtype_from_name(std::string name) {
  name = lower(std::move(name));
  if (name.rfind("torch.", 0) == 0) name = name.substr(6);
  if (name.rfind("backplane.", 0) == 0) name = name.substr(10);
  if (name.rfind("dtype.", 0) == 0) name = name.substr(6);
  if (name == "f32" || name == "float32" || name == "float") return DType::f32;
  if (name == "f64" || name == "float64" || name == "double") return DType::f64;
  if (name == "i32" || name == "int32" || name == "int") return DType::i32;
  if (name == "i64" || name == "int64" || name == "long") return DType::i64;
  if (name == "bool" || name == "bool_") return DType::bool_;
  if (name == "f16" || name == "float16" || name == "half") return DType::f16;
  if (name == "bf16" || name == "bfloat16") return DType::bf16;
  if (name == "u8" || name == "uint8") return DType::u8;
  if (name == "i8" || name == "int8") return DType::i8;
  return std::nullopt;
}

Capability to_capability(py::handle obj) {
  if (py::isinstance<Capability>(obj)) return obj.cast<Capability>();
  if (py::isinstance<py::str>(obj)) {
    const std::string name = obj.cast<std::string>();
    if (auto cap = capability_from_string(name)) return *cap;
    throw Error(Errc::invalid_argument, "unknown capability \"" + name +
                                            "\"; the known ones are collective, async, host_visible, remote, "
                                            "matmul, f32, f64, i32, i64, bool, f16, bf16, u8, i8");
  }
  throw Error(Errc::invalid_argument, "a capability is a backplane.Capability or its name, not " +
                                          std::string(py::str(py::type::of(obj))));
}

Op to_op(py::handle obj) {
  if (py::isinstance<Op>(obj)) return obj.cast<Op>();
  const std::string name = py::str(obj);
  if (auto op = op_from_string(name)) return *op;
  throw Error(Errc::invalid_argument, "unknown op \"" + name + "\"");
}

std::string device_repr(const Device& d) { return "Device(\"" + d.id() + "\", name=\"" + d.name() + "\")"; }

// An op fallback as backends.json spells it: "error" (or None) and
// "host:<backend>"; anything else is refused (invalid_argument) with the
// config's message.
OpFallback to_op_fallback(py::handle obj) {
  if (obj.is_none()) return {};
  if (!py::isinstance<py::str>(obj))
    throw Error(Errc::invalid_argument, "an op fallback is \"error\", \"host:<backend>\" or None, not " +
                                            std::string(py::str(py::type::of(obj))));
  const std::string s = obj.cast<std::string>();
  OpFallback f;
  if (s.size() > 5 && s.compare(0, 5, "host:") == 0) {
    f.kind = OpFallback::Kind::host;
    f.host_backend = s.substr(5);
  } else if (s != "error") {
    throw Error(Errc::invalid_argument,
                "op fallback: expected \"error\" or \"host:<backend>\", got \"" + s + "\"");
  }
  return f;
}

// The op_fallback_off() context: an OpFallbackOff for the with block, made
// on the thread that entered it and destroyed there (the guard is per thread:
// destroyed on another one it would switch that thread instead).
class OpFallbackOffContext {
 public:
  OpFallbackOffContext() = default;
  OpFallbackOffContext(const OpFallbackOffContext&) = delete;
  OpFallbackOffContext& operator=(const OpFallbackOffContext&) = delete;
  ~OpFallbackOffContext() {
    // Never exited (a with block always is): restore its thread's switch
    // only from that thread; from another one, leave it.
    if (guard_ && thread_ != std::this_thread::get_id()) static_cast<void>(guard_.release());
  }

  void enter() {
    if (guard_) throw Error(Errc::invalid_argument, "op_fallback_off(): this context is already entered");
    guard_ = std::make_unique<OpFallbackOff>();
    thread_ = std::this_thread::get_id();
  }
  void exit() {
    if (guard_ && thread_ != std::this_thread::get_id())
      throw Error(
          Errc::invalid_argument,
          "op_fallback_off(): exited on another thread than the one that entered it (the switch is per "
          "thread)");
    guard_.reset();
  }

 private:
  std::unique_ptr<OpFallbackOff> guard_;
  std::thread::id thread_;
};

}  // namespace

// ---- conversions ------------------------------------------------------------------

Registry& default_registry() {
  py::object current = g_module.attr("_default_registry");
  if (current.is_none()) {
    current = py::cast(Registry::from_env());
    g_module.attr("_default_registry") = current;
  }
  return current.cast<Registry&>();
}

Device to_device(py::handle obj) {
  if (obj.is_none()) return default_registry().default_backend().device(0);
  if (py::isinstance<Device>(obj)) return obj.cast<Device>();
  if (py::isinstance<Backend>(obj)) return obj.cast<Backend>().device(0);
  if (py::isinstance<py::str>(obj)) {
    const std::string id = obj.cast<std::string>();
    const auto colon = id.rfind(':');
    if (colon == std::string::npos) return default_registry().backend(id).device(0);
    int32_t index = 0;
    try {
      std::size_t used = 0;
      index = std::stoi(id.substr(colon + 1), &used);
      if (used != id.size() - colon - 1) throw std::invalid_argument(id);
    } catch (const std::exception&) {
      throw Error(Errc::invalid_argument, "device \"" + id + "\": expected \"backend\" or \"backend:index\"");
    }
    return default_registry().backend(id.substr(0, colon)).device(index);
  }
  throw Error(Errc::invalid_argument,
              "device= takes a backplane.Device, a Backend or a name like \"cpu:0\", not " +
                  std::string(py::str(py::type::of(obj))));
}

DType to_dtype(py::handle obj) {
  if (py::isinstance<DType>(obj)) return obj.cast<DType>();
  // Python's own types, as NumPy reads them.
  if (obj.ptr() == reinterpret_cast<PyObject*>(&PyBool_Type)) return DType::bool_;
  if (obj.ptr() == reinterpret_cast<PyObject*>(&PyLong_Type)) return DType::i64;
  if (obj.ptr() == reinterpret_cast<PyObject*>(&PyFloat_Type)) return DType::f64;
  std::optional<DType> found;
  if (py::isinstance<py::str>(obj)) {
    found = dtype_from_name(obj.cast<std::string>());
  } else if (py::hasattr(obj, "dtype") && !PyType_Check(obj.ptr())) {  // an array or a NumPy scalar
    return to_dtype(obj.attr("dtype"));
  } else if (PyType_Check(obj.ptr()) && py::hasattr(obj, "__name__")) {  // numpy.float32, ...
    found = dtype_from_name(obj.attr("__name__").cast<std::string>());
  } else if (py::hasattr(obj, "name") && py::isinstance<py::str>(obj.attr("name"))) {  // a numpy.dtype
    found = dtype_from_name(obj.attr("name").cast<std::string>());
  } else {
    found = dtype_from_name(py::str(obj).cast<std::string>());  // torch.float32
  }
  if (found) return *found;
  throw Error(Errc::invalid_argument, "unknown dtype " + std::string(py::repr(obj)) +
                                          "; backplane has f32, f64, i32, i64, bool, f16, bf16, u8, i8");
}

std::optional<DType> to_optional_dtype(py::handle obj) {
  if (obj.is_none()) return std::nullopt;
  return to_dtype(obj);
}

std::vector<int64_t> to_int_vector(py::handle obj) {
  if (PyLong_Check(obj.ptr())) return {obj.cast<int64_t>()};
  if (!py::isinstance<py::sequence>(obj) || py::isinstance<py::str>(obj))
    throw Error(Errc::invalid_argument,
                "expected an int or a sequence of ints, got " + std::string(py::str(py::type::of(obj))));
  std::vector<int64_t> out;
  for (py::handle item : py::reinterpret_borrow<py::sequence>(obj)) {
    if (!PyIndex_Check(item.ptr()))
      throw Error(Errc::invalid_argument, "expected ints, got " + std::string(py::repr(item)));
    out.push_back(py::reinterpret_steal<py::object>(PyNumber_Index(item.ptr())).cast<int64_t>());
  }
  return out;
}

Shape to_shape(py::handle obj) {
  const std::vector<int64_t> dims = to_int_vector(obj);
  if (dims.size() > static_cast<std::size_t>(Shape::kMaxRank))
    throw Error(Errc::invalid_argument, "a shape has at most " + std::to_string(Shape::kMaxRank) +
                                            " dimensions, got " + std::to_string(dims.size()));
  return Shape(dims);
}

// ---- Registry, Backend, Device, Capabilities ------------------------------------------

void bind_registry(py::module_& m) {
  g_module = m;
  m.attr("_default_registry") = py::none();

  py::enum_<DType>(m, "DType", "Element types (backplane::DType)")
      .value("f32", DType::f32)
      .value("f64", DType::f64)
      .value("i32", DType::i32)
      .value("i64", DType::i64)
      .value("bool_", DType::bool_)
      .value("f16", DType::f16)
      .value("bf16", DType::bf16)
      .value("u8", DType::u8)
      .value("i8", DType::i8)
      .def_property_readonly("itemsize", [](DType d) { return dtype_size(d); })
      .def_property_readonly(
          "is_floating_point",
          [](DType d) { return d == DType::f32 || d == DType::f64 || d == DType::f16 || d == DType::bf16; })
      .def("__str__", [](DType d) { return std::string(to_string(d)); });
  m.def("dtype", &to_dtype, py::arg("obj"),
        "The backplane.DType for a name (\"f32\", \"float32\"), a NumPy or torch dtype, or bool/int/float");

  py::enum_<Capability>(m, "Capability", py::arithmetic(), "Capability flags a device declares at runtime")
      .value("collective", Capability::collective)
      .value("async_", Capability::async)
      .value("host_visible", Capability::host_visible)
      .value("remote", Capability::remote)
      .value("matmul", Capability::matmul)
      .value("f32", Capability::f32)
      .value("f64", Capability::f64)
      .value("i32", Capability::i32)
      .value("i64", Capability::i64)
      .value("bool_", Capability::bool_)
      .value("f16", Capability::f16)
      .value("bf16", Capability::bf16)
      .value("u8", Capability::u8)
      .value("i8", Capability::i8)
      .def("__str__", [](Capability c) { return std::string(to_string(c)); });
  // `async` is a keyword in Python: also reachable as getattr(Capability, "async").
  py::setattr(m.attr("Capability"), "async", m.attr("Capability").attr("async_"));
  m.def("capability_for", &capability_for, py::arg("dtype"),
        "The flag that says a device holds tensors of dtype");

  py::class_<Capabilities>(
      m, "Capabilities",
      "A set of capability flags; `\"collective\" in caps` and `Capability.collective in caps`")
      .def(py::init<uint64_t>(), py::arg("bits") = 0)
      .def_property_readonly("bits", &Capabilities::bits)
      .def(
          "has", [](const Capabilities& c, py::handle cap) { return c.has(to_capability(cap)); },
          py::arg("capability"))
      .def("__contains__", [](const Capabilities& c, py::handle cap) { return c.has(to_capability(cap)); })
      .def("names", &Capabilities::names)
      .def("__iter__",
           [](const Capabilities& c) {
             py::list flags;
             for (const std::string& n : c.names()) flags.append(py::cast(*capability_from_string(n)));
             return py::iter(flags);
           })
      .def("__len__", [](const Capabilities& c) { return c.names().size(); })
      .def("__eq__", [](const Capabilities& a, const Capabilities& b) { return a == b; })
      .def("__hash__", [](const Capabilities& c) { return py::hash(py::int_(c.bits())); })
      .def("__str__", &Capabilities::to_string)
      .def("__repr__", [](const Capabilities& c) { return "Capabilities(" + c.to_string() + ")"; });

  // One value per row of abi.h's BP_OP_TABLE, named as Op's enumerator.
  py::enum_<Op> op(m, "Op", "The ops a plugin may run (Device.supports)");
#define BACKPLANE_PY_OP_VALUE_(NAME, v, name, kind, dtypes, inputs, attrs) op.value(#name, Op::name);
  BP_OP_TABLE(BACKPLANE_PY_OP_VALUE_)
#undef BACKPLANE_PY_OP_VALUE_
  op.def("__str__", [](Op o) { return std::string(to_string(o)); });

  py::class_<MemoryInfo>(m, "MemoryInfo", "A device's memory as its plugin reports it")
      .def_readonly("free_bytes", &MemoryInfo::free_bytes)
      .def_readonly("total_bytes", &MemoryInfo::total_bytes)
      .def("__repr__", [](const MemoryInfo& i) {
        return "MemoryInfo(free_bytes=" + std::to_string(i.free_bytes) +
               ", total_bytes=" + std::to_string(i.total_bytes) + ")";
      });

  py::class_<Device>(m, "Device", "One device of a loaded backend (backend.device(i))")
      .def_property_readonly("index", &Device::index)
      .def_property_readonly("id", &Device::id)
      // Text a plugin reports may hold bytes that are not UTF-8 (text()).
      .def_property_readonly("name", [](const Device& d) { return text(d.name()); })
      .def_property_readonly("capabilities", &Device::capabilities)
      .def_property_readonly("attributes",
                             [](const Device& d) {
                               py::dict out;
                               for (const auto& [key, value] : d.attributes()) out[text(key)] = text(value);
                               return out;
                             })
      .def_property_readonly("backend", &Device::backend)
      .def("memory", [](const Device& d) { return nogil([&] { return d.memory(); }); })
      .def(
          "supports",
          [](const Device& d, py::handle op, py::handle dtype) {
            return d.supports(to_op(op), to_dtype(dtype));
          },
          py::arg("op"), py::arg("dtype"))
      .def("synchronize", [](const Device& d) { nogil([&] { d.synchronize(); }); })
      .def("__eq__",
           [](const Device& a, py::handle b) { return py::isinstance<Device>(b) && a == b.cast<Device>(); })
      .def("__hash__", [](const Device& d) { return py::hash(py::str(d.id())); })
      .def("__str__", &Device::id)
      .def("__repr__", [](const Device& d) { return text(device_repr(d)); });

  py::class_<OpFallbackStats>(m, "OpFallbackStats",
                              "What one (op, dtype) of a backend cost by running on its op_fallback backend")
      .def_property_readonly("op", [](const OpFallbackStats& s) { return std::string(to_string(s.op)); })
      .def_property_readonly("dtype",
                             [](const OpFallbackStats& s) { return std::string(to_string(s.dtype)); })
      .def_readonly("calls", &OpFallbackStats::calls)
      .def_readonly("bytes_to_host", &OpFallbackStats::bytes_to_host)
      .def_readonly("bytes_from_host", &OpFallbackStats::bytes_from_host)
      .def_property_readonly("bytes_moved", &OpFallbackStats::bytes_moved)
      .def_readonly("seconds", &OpFallbackStats::seconds)
      .def("__repr__", [](const OpFallbackStats& s) {
        return "OpFallbackStats(op=\"" + std::string(to_string(s.op)) + "\", dtype=\"" +
               std::string(to_string(s.dtype)) + "\", calls=" + std::to_string(s.calls) +
               ", bytes_to_host=" + std::to_string(s.bytes_to_host) +
               ", bytes_from_host=" + std::to_string(s.bytes_from_host) +
               ", seconds=" + std::to_string(s.seconds) + ")";
      });

  py::class_<OpFallbackOffContext>(m, "_OpFallbackOffContext")
      .def(py::init<>())
      .def("__enter__", [](OpFallbackOffContext& c) { c.enter(); })
      .def("__exit__", [](OpFallbackOffContext& c, py::args) {
        c.exit();
        return false;
      });

  py::enum_<Backend::Status>(m, "BackendStatus")
      .value("loaded", Backend::Status::loaded)
      .value("failed", Backend::Status::failed)
      .value("unavailable", Backend::Status::unavailable);

  py::class_<Backend>(m, "Backend", "A configured backend (registry.backend(name)), loaded or not")
      .def_property_readonly("name", &Backend::name)
      .def_property_readonly("status", &Backend::status)
      .def_property_readonly("loaded", &Backend::loaded)
      .def_property_readonly("error", [](const Backend& b) { return text(b.error()); })
      .def_property_readonly("error_code", &Backend::error_code)
      .def_property_readonly("required", &Backend::required)
      .def_property_readonly("library", &Backend::library)
      .def_property_readonly("library_path", [](const Backend& b) { return path_text(b.library_path()); })
      .def_property_readonly("version", [](const Backend& b) { return text(b.version()); })
      .def_property_readonly("abi_version", &Backend::abi_version)
      .def_property_readonly("collective_fallback",
                             [](const Backend& b) { return b.collective_fallback().to_string(); })
      .def_property_readonly("op_fallback", [](const Backend& b) { return b.op_fallback().to_string(); })
      .def("op_fallback_stats", &Backend::op_fallback_stats,
           "What ran on the op fallback so far, one entry per (op, dtype), most time first")
      .def("reset_op_fallback_stats", &Backend::reset_op_fallback_stats)
      .def_property_readonly("capabilities", &Backend::capabilities)
      .def_property_readonly("device_count", &Backend::device_count)
      .def("device", &Backend::device, py::arg("index") = 0)
      .def_property_readonly("devices", &Backend::devices)
      .def("__repr__", [](const Backend& b) {
        std::string s = "Backend(\"" + b.name() + "\", ";
        if (b.loaded()) return text(s + "loaded, " + std::to_string(b.device_count()) + " device(s))");
        return text(s + (b.status() == Backend::Status::failed ? "failed: " : "unavailable: ") + b.error() +
                    ")");
      });

  py::enum_<RequiredPolicy>(m, "RequiredPolicy")
      .value("throw_on_failure", RequiredPolicy::throw_on_failure)
      .value("report", RequiredPolicy::report);

  py::class_<Registry>(m, "Registry", "The backends loaded from a backends.json")
      .def_static("from_config", &Registry::from_config, py::arg("path"),
                  py::arg("policy") = RequiredPolicy::throw_on_failure)
      .def_static("from_json", &Registry::from_json, py::arg("json"), py::arg("base_dir"),
                  py::arg("source_name") = "<json>", py::arg("policy") = RequiredPolicy::throw_on_failure)
      .def_static("from_env", &Registry::from_env)
      .def_static("default_config_path", &Registry::default_config_path)
      .def_property_readonly("backends", &Registry::backends)
      .def("backend", &Registry::backend, py::arg("name"))
      .def_property_readonly("default_backend", &Registry::default_backend)
      .def_property_readonly("config_path", &Registry::config_path)
      .def(
          "set_op_fallback",
          [](const Registry& r, const std::string& name, py::handle fallback) {
            const OpFallback f = to_op_fallback(fallback);
            nogil([&] { r.set_op_fallback(name, f); });
          },
          py::arg("name"), py::arg("fallback"),
          "Sets backend `name`'s op fallback (\"error\" or None, \"host:<backend>\") with the config's rules")
      .def("__repr__", [](const Registry& r) {
        std::string names;
        for (const Backend& b : r.backends()) names += (names.empty() ? "" : ", ") + b.name();
        return text("Registry(" + r.config_path().string() + ": " + names + ")");
      });

  m.def(
      "default_registry",
      [] {
        default_registry();
        return g_module.attr("_default_registry");
      },
      "The registry used where none is named: set_default_registry's, else Registry.from_env()");
  m.def(
      "set_default_registry",
      [](py::object registry) {
        if (!registry.is_none()) registry.cast<Registry&>();  // type check
        g_module.attr("_default_registry") = registry;
      },
      py::arg("registry"), "Use `registry` where none is named (None: Registry.from_env() on next use)");
}

}  // namespace backplane::python

PYBIND11_MODULE(_backplane, m) {
  namespace bpy = backplane::python;
  m.doc() = "backplane's C++ API for Python (use the `backplane` package, which re-exports this)";
  bpy::bind_errors(m);
  bpy::bind_registry(m);
  bpy::bind_tensor(m);
  bpy::bind_dlpack(m);
  bpy::bind_safetensors(m);
  bpy::bind_distributed(m);
  bpy::bind_nn(m);
  bpy::bind_trace(m);
}
