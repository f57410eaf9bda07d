// DLPack in Python, zero-copy both ways, over the core's to_dlpack and
// from_dlpack: Tensor.__dlpack__ / __dlpack_device__ (so np.from_dlpack and
// torch.from_dlpack share a tensor's memory) and backplane.from_dlpack for any
// producer. The capsule protocol: a producer's capsule is named "dltensor"
// (or "dltensor_versioned" for DLPack >= 1.0, offered when the consumer passes
// max_version >= (1, 0)); the consumer renames it "used_dltensor[_versioned]"
// and from then on owns the managed tensor and runs its deleter, so the
// capsule's own destructor frees it only when nobody consumed it.
//
// Lifetimes: an exported capsule keeps the tensor's storage alive (the core's
// DLManagedTensor holds it) until the consumer runs the deleter; an imported
// tensor keeps the producer's managed tensor until the last backplane tensor
// viewing it goes away. That can happen on any thread and with the GIL
// released (inside an op, in backward), while producers such as NumPy drop a
// Python reference in their deleter: foreign deleters therefore run under
// the GIL (PyGILState_Ensure), and not at all once the interpreter is
// finalizing (the memory then goes with the process).
#include "common.hpp"

#include <dlpack/dlpack.h>

#include <memory>

namespace backplane::python {
namespace {

// DLPack 1.0's versioned managed tensor. Debian's dlpack.h (0.6) predates it;
// the layout is fixed by the DLPack ABI and its DLTensor is 0.6's.
struct DLPackVersion1 {
  uint32_t major;
  uint32_t minor;
};
struct ManagedTensorVersioned {
  DLPackVersion1 version;
  void* manager_ctx;
  void (*deleter)(ManagedTensorVersioned* self);
  uint64_t flags;
  DLTensor dl_tensor;
};
constexpr uint64_t kFlagReadOnly = uint64_t{1} << 0;
constexpr uint64_t kFlagIsCopied = uint64_t{1} << 1;

constexpr const char* kLegacy = "dltensor";
constexpr const char* kLegacyUsed = "used_dltensor";
constexpr const char* kVersioned = "dltensor_versioned";
constexpr const char* kVersionedUsed = "used_dltensor_versioned";

// The context of every capsule backplane makes: a capsule carrying it holds a
// managed tensor the core made, which needs no GIL to free and which the
// core recognises on import (a bool tensor comes back as bool).
char g_capsule_marker;

[[noreturn]] void buffer_error(const std::string& message) {
  PyErr_SetString(PyExc_BufferError, message.c_str());
  throw py::error_already_set();
}

bool finalizing() {
#if PY_VERSION_HEX >= 0x030D0000
  return Py_IsFinalizing() != 0;
#else
  return _Py_IsFinalizing() != 0;
#endif
}

// ---- producing ------------------------------------------------------------------------

// Frees the managed tensor of a capsule nobody consumed.
template <class Managed>
void capsule_destructor(PyObject* capsule, const char* unused_name) {
  PyObject *type = nullptr, *value = nullptr, *traceback = nullptr;
  PyErr_Fetch(&type, &value, &traceback);
  if (PyCapsule_IsValid(capsule, unused_name) != 0) {
    auto* managed = static_cast<Managed*>(PyCapsule_GetPointer(capsule, unused_name));
    if (managed != nullptr && managed->deleter != nullptr) managed->deleter(managed);
  }
  PyErr_Restore(type, value, traceback);
}
void legacy_capsule_destructor(PyObject* capsule) { capsule_destructor<DLManagedTensor>(capsule, kLegacy); }
void versioned_capsule_destructor(PyObject* capsule) {
  capsule_destructor<ManagedTensorVersioned>(capsule, kVersioned);
}

// A versioned shell around the core's legacy export.
void delete_versioned_shell(ManagedTensorVersioned* self) {
  auto* inner = static_cast<DLManagedTensor*>(self->manager_ctx);
  if (inner != nullptr && inner->deleter != nullptr) inner->deleter(inner);
  delete self;
}

struct ManagedDeleter {
  void operator()(DLManagedTensor* m) const noexcept {
    if (m != nullptr && m->deleter != nullptr) m->deleter(m);
  }
};
using ManagedPtr = std::unique_ptr<DLManagedTensor, ManagedDeleter>;

std::pair<int, int> device_pair(const DLDevice& d) { return {static_cast<int>(d.device_type), d.device_id}; }

// Where an export of t would live, without exporting when the answer is
// known: host-visible memory is {kDLCPU, 0}.
std::pair<int, int> dlpack_device(const Tensor& t) {
  if (t.device().capabilities().has(Capability::host_visible)) return {kDLCPU, 0};
  ManagedPtr m(nogil([&] { return to_dlpack(t); }));
  return device_pair(m->dl_tensor.device);
}

py::object export_capsule(const Tensor& t, py::handle stream, py::handle max_version, py::handle dl_device,
                          py::handle copy) {
  const bool want_copy = !copy.is_none() && copy.cast<bool>();
  const bool forbid_copy = !copy.is_none() && !copy.cast<bool>();
  bool versioned = false;
  if (!max_version.is_none()) {
    const auto v = max_version.cast<std::pair<int, int>>();
    versioned = v.first >= 1;
  }
  ManagedPtr m(nogil([&] { return to_dlpack(want_copy ? contiguous(t) : t); }));
  const auto where = device_pair(m->dl_tensor.device);
  const bool copied =
      want_copy || (where.first == kDLCPU && !t.device().capabilities().has(Capability::host_visible));
  if (forbid_copy && copied)
    buffer_error("__dlpack__(copy=False): " + t.to_string() +
                 " lives in memory the host cannot address; exporting it needs a copy");
  if (!dl_device.is_none() && dl_device.cast<std::pair<int, int>>() != where)
    buffer_error("__dlpack__: " + t.to_string() + " is exported on DLPack device (" +
                 std::to_string(where.first) + ", " + std::to_string(where.second) + "), not the requested " +
                 std::string(py::repr(dl_device)));
  // The core synchronises the device before exporting, so the data is ready
  // on any stream of the consumer. Host memory has no streams.
  if (!stream.is_none()) {
    const bool host = where.first == kDLCPU || where.first == kDLCUDAHost || where.first == kDLROCMHost;
    const auto s = stream.cast<int64_t>();
    if (host && s != -1)
      buffer_error("__dlpack__: stream must be None for host memory, got " + std::to_string(s));
    if (!host && s == 0)
      buffer_error("__dlpack__: stream 0 is ambiguous and not allowed by the DLPack protocol");
  }
  PyObject* capsule = nullptr;
  if (versioned) {
    auto* shell = new ManagedTensorVersioned{
        {1, 0}, m.get(), &delete_versioned_shell, copied ? kFlagIsCopied : 0, m->dl_tensor};
    m.release();
    capsule = PyCapsule_New(shell, kVersioned, &versioned_capsule_destructor);
    if (capsule == nullptr) {
      delete_versioned_shell(shell);
      throw py::error_already_set();
    }
  } else {
    capsule = PyCapsule_New(m.get(), kLegacy, &legacy_capsule_destructor);
    if (capsule == nullptr) throw py::error_already_set();
    m.release();
  }
  py::object out = py::reinterpret_steal<py::object>(capsule);
  if (PyCapsule_SetContext(capsule, &g_capsule_marker) != 0) throw py::error_already_set();
  return out;
}

// ---- consuming --------------------------------------------------------------------------

// A foreign managed tensor (legacy or versioned) as a legacy one whose
// deleter takes the GIL before running the producer's.
struct ForeignContext {
  DLManagedTensor outer{};
  DLManagedTensor* legacy = nullptr;
  ManagedTensorVersioned* versioned = nullptr;
};

void delete_foreign(DLManagedTensor* self) {
  auto* ctx = static_cast<ForeignContext*>(self->manager_ctx);
  if (Py_IsInitialized() != 0 && !finalizing()) {
    const PyGILState_STATE state = PyGILState_Ensure();
    if (ctx->legacy != nullptr && ctx->legacy->deleter != nullptr) ctx->legacy->deleter(ctx->legacy);
    if (ctx->versioned != nullptr && ctx->versioned->deleter != nullptr)
      ctx->versioned->deleter(ctx->versioned);
    PyGILState_Release(state);
  }
  delete ctx;
}

DLManagedTensor* wrap_foreign(DLManagedTensor* legacy, ManagedTensorVersioned* versioned) {
  auto* ctx = new ForeignContext;
  ctx->legacy = legacy;
  ctx->versioned = versioned;
  ctx->outer.dl_tensor = legacy != nullptr ? legacy->dl_tensor : versioned->dl_tensor;
  ctx->outer.manager_ctx = ctx;
  ctx->outer.deleter = &delete_foreign;
  return &ctx->outer;
}

bool is_host(int device_type) {
  return device_type == kDLCPU || device_type == kDLCUDAHost || device_type == kDLROCMHost;
}

// Takes the managed tensor out of a capsule (renaming it) and imports it.
Tensor consume_capsule(py::handle capsule, const Device& device, bool copy) {
  const char* name = PyCapsule_GetName(capsule.ptr());
  if (name == nullptr) throw py::error_already_set();
  const std::string_view n(name);
  const bool ours = PyCapsule_GetContext(capsule.ptr()) == &g_capsule_marker;
  DLManagedTensor* handoff = nullptr;
  if (n == kLegacy) {
    auto* m = static_cast<DLManagedTensor*>(PyCapsule_GetPointer(capsule.ptr(), kLegacy));
    if (m == nullptr) throw py::error_already_set();
    if (PyCapsule_SetName(capsule.ptr(), kLegacyUsed) != 0) throw py::error_already_set();
    handoff = ours ? m : wrap_foreign(m, nullptr);
  } else if (n == kVersioned) {
    auto* v = static_cast<ManagedTensorVersioned*>(PyCapsule_GetPointer(capsule.ptr(), kVersioned));
    if (v == nullptr) throw py::error_already_set();
    if (v->version.major != 1)  // left unconsumed: the producer's capsule frees it
      buffer_error("from_dlpack: DLPack " + std::to_string(v->version.major) + "." +
                   std::to_string(v->version.minor) +
                   " is not supported; backplane reads DLPack 1.x and the unversioned (0.x) protocol");
    if (PyCapsule_SetName(capsule.ptr(), kVersionedUsed) != 0) throw py::error_already_set();
    copy = copy || (v->flags & kFlagReadOnly) != 0;  // read-only memory is never shared writable
    if (ours) {
      handoff = static_cast<DLManagedTensor*>(v->manager_ctx);
      delete v;  // our shell; the core's export inside is handed on
    } else {
      handoff = wrap_foreign(nullptr, v);
    }
  } else if (n == kLegacyUsed || n == kVersionedUsed) {
    buffer_error("from_dlpack: this DLPack capsule was already consumed (a capsule can be consumed once)");
  } else {
    throw Error(Errc::invalid_argument, "from_dlpack: a capsule named \"" + std::string(n) +
                                            "\" is not a DLPack capsule (\"dltensor\")");
  }
  // from_dlpack owns handoff from here on, also when it throws.
  return nogil([&] {
    Tensor t = from_dlpack(handoff, device);
    return copy ? contiguous(t) : t;
  });
}

// The Python buffer protocol (memoryview(t), np.asarray(t)): a writable view
// of host-visible memory. The view's owner is the Python tensor, whose handle
// keeps the storage alive; the address comes from a DLPack export that is
// dropped at once (the storage outlives it). Other memory has no view.
py::buffer_info buffer_of(PyTensor& self) {
  const Tensor& t = self.t;
  const char* format = nullptr;
  switch (t.dtype()) {
    case DType::f32:
      format = "f";
      break;
    case DType::f64:
      format = "d";
      break;
    case DType::i32:
      format = "i";
      break;
    case DType::i64:
      format = "q";
      break;
    case DType::bool_:
      format = "?";
      break;
    case DType::f16:
      format = "e";
      break;
    case DType::u8:
      format = "B";
      break;
    case DType::i8:
      format = "b";
      break;
    case DType::bf16:
      buffer_error("bf16 has no Python buffer format; use t.astype(\"f32\")");
  }
  if (!t.device().capabilities().has(Capability::host_visible))
    buffer_error(t.to_string() + " is not in host-visible memory: no buffer view (t.numpy() copies it)");
  ManagedPtr m(nogil([&] { return to_dlpack(t); }));
  if (m->dl_tensor.device.device_type != kDLCPU) buffer_error(t.to_string() + " is not in host memory");
  const auto itemsize = static_cast<py::ssize_t>(dtype_size(t.dtype()));
  std::vector<py::ssize_t> shape(m->dl_tensor.shape, m->dl_tensor.shape + m->dl_tensor.ndim);
  std::vector<py::ssize_t> strides(static_cast<std::size_t>(m->dl_tensor.ndim));
  for (std::size_t i = 0; i < strides.size(); ++i) strides[i] = m->dl_tensor.strides[i] * itemsize;
  return py::buffer_info(m->dl_tensor.data, itemsize, format, m->dl_tensor.ndim, std::move(shape),
                         std::move(strides),
                         /*readonly=*/false);
}

}  // namespace

Tensor import_dlpack(py::handle obj, const std::optional<Device>& device, bool copy) {
  if (is_pytensor(obj)) {  // already ours: share it (or move it to `device`)
    const Tensor& t = as_pytensor(obj).t;
    return nogil([&] {
      Tensor out = device ? to(t, *device) : t;
      return copy && out.device() == t.device() ? contiguous(out) : out;
    });
  }
  if (PyCapsule_CheckExact(obj.ptr()))  // the older API: torch.utils.dlpack.to_dlpack(x)
    return consume_capsule(obj, device ? *device : to_device(py::none()), copy);
  if (!py::hasattr(obj, "__dlpack__"))
    throw Error(Errc::invalid_argument,
                "from_dlpack: " + std::string(py::str(py::type::of(obj))) +
                    " has no __dlpack__ (pass a NumPy array, a torch tensor, a DLPack "
                    "capsule or anything that implements the DLPack protocol)");
  std::pair<int, int> where{kDLCPU, 0};
  if (py::hasattr(obj, "__dlpack_device__"))
    where = obj.attr("__dlpack_device__")().cast<std::pair<int, int>>();
  if (!device && !is_host(where.first))
    throw Error(Errc::invalid_argument, "from_dlpack: the producer's memory is on DLPack device (" +
                                            std::to_string(where.first) + ", " +
                                            std::to_string(where.second) +
                                            "); pass device= the backplane device that owns it");
  const Device target = device ? *device : to_device(py::none());
  // stream=None: host memory has none, and for device memory it asks the
  // producer to make its data ready on the legacy default stream.
  py::object capsule;
  try {
    capsule =
        obj.attr("__dlpack__")(py::arg("stream") = py::none(), py::arg("max_version") = py::make_tuple(1, 0));
  } catch (py::error_already_set& e) {
    if (!e.matches(PyExc_TypeError)) throw;  // producers older than DLPack 1.0 take no max_version
    capsule = obj.attr("__dlpack__")(py::arg("stream") = py::none());
  }
  return consume_capsule(capsule, target, copy);
}

void bind_dlpack(py::module_& m) {
  py::class_<PyTensor> cls = py::reinterpret_borrow<py::class_<PyTensor>>(m.attr("Tensor"));
  cls.def_buffer(&buffer_of);
  cls.def(
         "__dlpack__",
         [](const PyTensor& t, py::handle stream, py::handle max_version, py::handle dl_device,
            py::handle copy) { return export_capsule(t.t, stream, max_version, dl_device, copy); },
         py::kw_only(), py::arg("stream") = py::none(), py::arg("max_version") = py::none(),
         py::arg("dl_device") = py::none(), py::arg("copy") = py::none(),
         "A DLPack capsule sharing this tensor's memory (the DLPack protocol; np.from_dlpack and "
         "torch.from_dlpack call it)")
      .def("__dlpack_device__", [](const PyTensor& t) {
        const auto where = dlpack_device(t.t);
        return py::make_tuple(where.first, where.second);
      });
  m.def(
      "to_dlpack",
      [](const PyTensor& t) { return export_capsule(t.t, py::none(), py::none(), py::none(), py::none()); },
      py::arg("t"), "A legacy \"dltensor\" capsule of t (as torch.utils.dlpack.to_dlpack)");
  m.def(
      "from_dlpack",
      [](py::handle x, py::handle device, py::handle copy) {
        const bool want_copy = !copy.is_none() && copy.cast<bool>();
        return PyTensor(import_dlpack(
            x, device.is_none() ? std::nullopt : std::optional<Device>(to_device(device)), want_copy));
      },
      py::arg("x"), py::arg("device") = py::none(), py::kw_only(), py::arg("copy") = py::none(),
      "A tensor sharing x's memory: x is anything with __dlpack__ (NumPy arrays, torch tensors, ...) or a "
      "DLPack capsule. device: the backplane device to import onto (default: the default device for host "
      "memory); "
      "copy=True copies instead");
}

}  // namespace backplane::python
