// What the binding's translation units share: the Python tensor object
// (PyTensor), the conversions from Python values to devices, dtypes, shapes and
// operands, and the helper that releases the GIL around calls into the core.
#ifndef BACKPLANE_PYTHON_COMMON_HPP_
#define BACKPLANE_PYTHON_COMMON_HPP_

#include <backplane/backplane.hpp>

#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace backplane::python {

namespace py = pybind11;

// Runs f with the GIL released: every op, read, collective and backward goes
// through here so that other Python threads run meanwhile. f must not touch
// Python objects. Exceptions leave with the GIL held again (the release guard
// re-acquires it while unwinding).
template <class F>
decltype(auto) nogil(F&& f) {
  py::gil_scoped_release release;
  return std::forward<F>(f)();
}

// The Python object behind backplane.Tensor. The core keeps no gradient on a
// tensor (each backward() returns its own Gradients), so the Python `.grad`
// lives here: backward() hands each tracked leaf its gradient. A leaf is
// tracked once Python marks it (requires_grad=True, requires_grad_(),
// nn.Linear's parameters); tracking is a set of live objects, touched only
// with the GIL held.
struct PyTensor {
  Tensor t;
  std::optional<Tensor> grad;
  bool tracked = false;

  explicit PyTensor(Tensor tensor) : t(std::move(tensor)) {}
  // Moves (pybind11 moves returned values into their Python object) carry the
  // data, never the tracking: only an object owned by Python is tracked.
  PyTensor(PyTensor&& other) noexcept : t(std::move(other.t)), grad(std::move(other.grad)) {}
  PyTensor(const PyTensor&) = delete;
  PyTensor& operator=(const PyTensor&) = delete;
  PyTensor& operator=(PyTensor&&) = delete;
  ~PyTensor();

  // Marks the tensor as a leaf requiring grad and tracks this object.
  void require_grad();
};

// Accumulates the gradients of one backward() into the tracked leaves' .grad.
void deliver_gradients(const Gradients& gradients);

// ---- conversions --------------------------------------------------------------
// The registry used when none is named: set_default_registry's, else
// Registry::from_env() made on first use.
Registry& default_registry();
// None: the default registry's default backend, device 0; a Device; "cpu" or
// "cpu:1" from the default registry.
Device to_device(py::handle obj);
// A DType, or "f32"/"float32", a NumPy dtype or scalar type, a torch dtype,
// or Python's bool/int/float types.
DType to_dtype(py::handle obj);
std::optional<DType> to_optional_dtype(py::handle obj);
// An int or a sequence of ints.
Shape to_shape(py::handle obj);
std::vector<int64_t> to_int_vector(py::handle obj);

// backplane.tensor(): a new tensor (never sharing memory with `data`) from a
// backplane tensor, a buffer (bytes, array.array, NumPy arrays, memoryview),
// anything with __dlpack__ or __array__, a Python scalar or nested sequences.
Tensor make_tensor(py::handle data, const std::optional<Device>& device, std::optional<DType> dtype);
// An operand for an op with `like`: the tensor itself, a Python scalar as a
// 0-d tensor of like's dtype on like's device, else make_tensor there.
Tensor as_operand(py::handle obj, const Tensor& like);

// Casting helpers.
inline bool is_pytensor(py::handle obj);
PyTensor& as_pytensor(py::handle obj);
py::object wrap(Tensor t);

// The type object of backplane.Tensor, set when the class is bound.
extern PyTypeObject* g_tensor_type;
inline bool is_pytensor(py::handle obj) {
  return g_tensor_type != nullptr && PyObject_TypeCheck(obj.ptr(), g_tensor_type);
}

// ---- text --------------------------------------------------------------------
// C++ strings are bytes; Python's str is text. Strings that come from files,
// plugins or the environment may hold bytes that are not UTF-8, and pybind11's
// own conversion would raise UnicodeDecodeError for them instead of answering.
// Text for people (messages, names and attributes a plugin reports): such
// bytes show as \xNN (errors="backslashreplace").
py::str text(std::string_view s);
// A path, as os.fsdecode makes it (errors="surrogateescape"): os.fsencode
// gives the original bytes back.
py::str path_text(std::string_view s);
// A str as UTF-8 for the core; a lone surrogate (which UTF-8 cannot encode)
// raises InvalidArgument naming `what` and the index.
std::string utf8(py::handle s, const std::string& what);

// ---- the parts of the module, one per translation unit -------------------------
void bind_errors(py::module_& m);
void bind_registry(py::module_& m);
void bind_tensor(py::module_& m);
void bind_dlpack(py::module_& m);
void bind_safetensors(py::module_& m);
void bind_distributed(py::module_& m);
void bind_nn(py::module_& m);
void bind_trace(py::module_& m);

}  // namespace backplane::python

#endif  // BACKPLANE_PYTHON_COMMON_HPP_
