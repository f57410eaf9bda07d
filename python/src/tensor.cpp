// backplane.Tensor and every op: creation (backplane.tensor from lists,
// buffers and arrays; zeros, arange, ...), the elementwise, reduction,
// linear-algebra, softmax and shape ops as functions and methods, the
// operator overloads (with NumPy broadcasting, which the core does), reads
// (tolist, item), and autodiff (requires_grad, backward, .grad, no_grad).
// Every call into the core runs with the GIL released (nogil).
#include "common.hpp"

#include <backplane_common/half.hpp>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <memory>
#include <unordered_set>

namespace backplane::python {

PyTypeObject* g_tensor_type = nullptr;

Tensor import_dlpack(py::handle obj, const std::optional<Device>& device, bool copy);  // dlpack.cpp

namespace {

// The tracked leaves (see PyTensor). Never destroyed: PyTensor objects that
// outlive the interpreter must still find it.
std::unordered_set<PyTensor*>& tracked() {
  static auto* set = new std::unordered_set<PyTensor*>();
  return *set;
}

[[noreturn]] void invalid(const std::string& message) { throw Error(Errc::invalid_argument, message); }

// ---- reading elements back ------------------------------------------------------

// The elements as Python objects, flat, row-major.
std::vector<py::object> read_values(const Tensor& t) {
  const auto n = static_cast<std::size_t>(t.numel());
  std::vector<py::object> out;
  out.reserve(n);
  auto read = [&](auto tag, auto convert) {
    using T = decltype(tag);
    std::vector<T> v(n);
    nogil([&] { t.read_into(t.dtype(), v.data(), n); });
    for (const T& x : v) out.push_back(convert(x));
  };
  switch (t.dtype()) {
    case DType::f32:
      read(float{}, [](float x) { return py::float_(x); });
      break;
    case DType::f64:
      read(double{}, [](double x) { return py::float_(x); });
      break;
    case DType::i32:
      read(int32_t{}, [](int32_t x) { return py::int_(x); });
      break;
    case DType::i64:
      read(int64_t{}, [](int64_t x) { return py::int_(x); });
      break;
    case DType::bool_:
      read(uint8_t{}, [](uint8_t x) { return py::bool_(x != 0); });
      break;
    case DType::u8:
      read(uint8_t{}, [](uint8_t x) { return py::int_(x); });
      break;
    case DType::i8:
      read(int8_t{}, [](int8_t x) { return py::int_(x); });
      break;
    case DType::f16:
      read(uint16_t{}, [](uint16_t x) { return py::float_(common::f16_to_f32(x)); });
      break;
    case DType::bf16:
      read(uint16_t{}, [](uint16_t x) { return py::float_(common::bf16_to_f32(x)); });
      break;
  }
  return out;
}

py::object nest(const std::vector<py::object>& flat, const Shape& shape, int dim, std::size_t& pos) {
  if (dim == shape.rank()) return flat[pos++];
  py::list out(static_cast<std::size_t>(shape[dim]));
  for (int64_t i = 0; i < shape[dim]; ++i) out[static_cast<std::size_t>(i)] = nest(flat, shape, dim + 1, pos);
  return out;
}

py::object tolist(const Tensor& t) {
  const std::vector<py::object> flat = read_values(t);
  std::size_t pos = 0;
  return nest(flat, t.shape(), 0, pos);
}

py::object item(const Tensor& t) {
  if (t.numel() != 1)
    invalid("item(): the tensor has " + std::to_string(t.numel()) + " elements, not one (" + t.to_string() +
            ")");
  return read_values(t)[0];
}

// ---- building tensors from Python data ---------------------------------------------

std::optional<DType> dtype_of_format(std::string_view format, Py_ssize_t itemsize) {
  while (!format.empty() && (format[0] == '@' || format[0] == '=' || format[0] == '<' || format[0] == '|'))
    format.remove_prefix(1);
  if (format.size() != 1) return std::nullopt;
  switch (format[0]) {
    case '?':
      return DType::bool_;
    case 'b':
      return DType::i8;
    case 'B':
      return DType::u8;
    case 'e':
      return DType::f16;
    case 'f':
      return DType::f32;
    case 'd':
      return DType::f64;
    case 'i':
    case 'l':
    case 'q':
    case 'n':
      if (itemsize == 4) return DType::i32;
      if (itemsize == 8) return DType::i64;
      return std::nullopt;
    default:
      return std::nullopt;
  }
}

// Copies a strided buffer into compact row-major bytes.
void copy_strided(const char* src, const Py_ssize_t* shape, const Py_ssize_t* strides, int ndim,
                  Py_ssize_t itemsize, char*& dst) {
  if (ndim == 0) {
    std::memcpy(dst, src, static_cast<std::size_t>(itemsize));
    dst += itemsize;
    return;
  }
  for (Py_ssize_t i = 0; i < shape[0]; ++i)
    copy_strided(src + i * strides[0], shape + 1, strides + 1, ndim - 1, itemsize, dst);
}

struct BufferView {
  Py_buffer view{};
  bool held = false;
  ~BufferView() {
    if (held) PyBuffer_Release(&view);
  }
};

Tensor from_buffer(py::handle obj, const Device& device, std::optional<DType> dtype) {
  BufferView b;
  if (PyObject_GetBuffer(obj.ptr(), &b.view, PyBUF_RECORDS_RO) != 0) throw py::error_already_set();
  b.held = true;
  const std::string_view format = b.view.format != nullptr ? b.view.format : "B";
  const std::optional<DType> native = dtype_of_format(format, b.view.itemsize);
  if (!native)
    throw Error(Errc::dtype_mismatch,
                "backplane.tensor: a buffer of format \"" + std::string(format) + "\" (" +
                    std::to_string(b.view.itemsize) +
                    " bytes per item) has no backplane dtype; backplane has f32, f64, i32, i64, "
                    "bool, f16, bf16, u8, i8 (native byte order)");
  if (b.view.ndim > Shape::kMaxRank)
    invalid("backplane.tensor: " + std::to_string(b.view.ndim) + " dimensions; at most " +
            std::to_string(Shape::kMaxRank));
  std::vector<int64_t> dims(b.view.shape, b.view.shape + b.view.ndim);
  if (b.view.ndim == 1 && b.view.shape == nullptr) dims = {b.view.len / b.view.itemsize};
  const Shape shape(dims);
  const auto count = static_cast<std::size_t>(shape.numel());
  Tensor out;
  if (PyBuffer_IsContiguous(&b.view, 'C') != 0 || b.view.strides == nullptr) {
    const void* data = b.view.buf;
    out = nogil([&] { return Tensor::from_bytes(device, shape, *native, data, count); });
  } else {
    std::vector<char> compact(count * static_cast<std::size_t>(b.view.itemsize));
    char* dst = compact.data();
    copy_strided(static_cast<const char*>(b.view.buf), b.view.shape, b.view.strides, b.view.ndim,
                 b.view.itemsize, dst);
    out = nogil([&] { return Tensor::from_bytes(device, shape, *native, compact.data(), count); });
  }
  if (dtype && *dtype != *native) out = nogil([&] { return cast(out, *dtype); });
  return out;
}

// Nested sequences and scalars: the shape from the nesting, the dtype from the
// values (any float: f32; else any int: i64; else bool), as torch.tensor does.
struct Leaves {
  std::vector<int64_t> shape;
  std::vector<int64_t> ints;
  std::vector<double> floats;
  int kind = 0;  // 0 bool, 1 int, 2 float
};

bool is_sequence(py::handle obj) {
  return PySequence_Check(obj.ptr()) && !PyUnicode_Check(obj.ptr()) && !PyBytes_Check(obj.ptr()) &&
         !is_pytensor(obj);
}

void walk(py::handle obj, std::size_t depth, Leaves& out) {
  if (is_sequence(obj)) {
    const py::sequence seq = py::reinterpret_borrow<py::sequence>(obj);
    const auto n = static_cast<int64_t>(seq.size());
    if (depth == out.shape.size()) {
      if (!out.ints.empty())
        invalid("backplane.tensor: ragged nested sequence (a list where a number was expected)");
      if (depth >= static_cast<std::size_t>(Shape::kMaxRank))
        invalid("backplane.tensor: more than " + std::to_string(Shape::kMaxRank) + " levels of nesting");
      out.shape.push_back(n);
    } else if (depth > out.shape.size() || out.shape[depth] != n) {
      invalid("backplane.tensor: ragged nested sequence: a sequence of " + std::to_string(n) +
              " elements where the first had " +
              (depth < out.shape.size() ? std::to_string(out.shape[depth]) : "none"));
    }
    for (py::handle item : seq) walk(item, depth + 1, out);
    return;
  }
  if (depth != out.shape.size())
    invalid("backplane.tensor: ragged nested sequence (a number where a list was expected)");
  if (is_pytensor(obj)) {
    const Tensor& t = as_pytensor(obj).t;
    if (t.numel() != 1)
      invalid("backplane.tensor: a nested tensor must have one element, not " + t.to_string());
    return walk(item(t), depth, out);
  }
  if (PyBool_Check(obj.ptr())) {
    out.ints.push_back(obj.ptr() == Py_True ? 1 : 0);
    out.floats.push_back(obj.ptr() == Py_True ? 1.0 : 0.0);
  } else if (PyLong_Check(obj.ptr()) || (PyIndex_Check(obj.ptr()) && !PyFloat_Check(obj.ptr()))) {
    py::object index = py::reinterpret_steal<py::object>(PyNumber_Index(obj.ptr()));
    if (!index) throw py::error_already_set();
    int overflow = 0;
    const long long v = PyLong_AsLongLongAndOverflow(index.ptr(), &overflow);
    if (overflow != 0)
      invalid("backplane.tensor: " + std::string(py::repr(obj)) + " does not fit in 64 bits");
    out.ints.push_back(v);
    out.floats.push_back(static_cast<double>(v));
    out.kind = std::max(out.kind, 1);
  } else if (PyFloat_Check(obj.ptr()) || py::hasattr(obj, "__float__")) {
    const double v = PyFloat_AsDouble(obj.ptr());
    if (v == -1.0 && PyErr_Occurred()) throw py::error_already_set();
    out.ints.push_back(0);
    out.floats.push_back(v);
    out.kind = 2;
  } else {
    invalid("backplane.tensor: cannot make a tensor element from " + std::string(py::repr(obj)) + " (" +
            std::string(py::str(py::type::of(obj))) + ")");
  }
}

Tensor from_values(py::handle obj, const Device& device, std::optional<DType> dtype) {
  Leaves leaves;
  walk(obj, 0, leaves);
  const Shape shape(leaves.shape);
  const auto count = leaves.ints.size();
  Tensor out;
  if (leaves.kind == 2) {
    if (dtype == DType::f64) {
      out = nogil([&] { return Tensor::from_bytes(device, shape, DType::f64, leaves.floats.data(), count); });
    } else {
      std::vector<float> f(leaves.floats.begin(), leaves.floats.end());
      out = nogil([&] { return Tensor::from_bytes(device, shape, DType::f32, f.data(), count); });
    }
  } else if (leaves.kind == 1) {
    out = nogil([&] { return Tensor::from_bytes(device, shape, DType::i64, leaves.ints.data(), count); });
  } else {
    std::vector<uint8_t> b(leaves.ints.begin(), leaves.ints.end());
    out = nogil([&] { return Tensor::from_bytes(device, shape, DType::bool_, b.data(), count); });
  }
  if (dtype && *dtype != out.dtype()) out = nogil([&] { return cast(out, *dtype); });
  return out;
}

}  // namespace

// ---- PyTensor -------------------------------------------------------------------------

PyTensor::~PyTensor() {
  if (tracked) backplane::python::tracked().erase(this);
}

void PyTensor::require_grad() {
  t = t.require_grad();
  if (!tracked) {
    backplane::python::tracked().insert(this);
    tracked = true;
  }
}

void deliver_gradients(const Gradients& gradients) {
  if (gradients.empty()) return;
  for (PyTensor* leaf : tracked()) {
    std::optional<Tensor> g = gradients.get(leaf->t);
    if (!g) continue;
    if (leaf->grad) {
      // Gradients accumulate across backward() calls, as in PyTorch, until
      // .grad is reset (optimizer.zero_grad()).
      NoGradGuard no_grad;
      leaf->grad = add(*leaf->grad, *g);
    } else {
      leaf->grad = std::move(*g);
    }
  }
}

PyTensor& as_pytensor(py::handle obj) { return obj.cast<PyTensor&>(); }

py::object wrap(Tensor t) { return py::cast(PyTensor(std::move(t))); }

Tensor make_tensor(py::handle data, const std::optional<Device>& device, std::optional<DType> dtype) {
  if (is_pytensor(data)) {
    const Tensor& src = as_pytensor(data).t;
    const Device dev = device ? *device : src.device();
    return nogil([&] {
      NoGradGuard no_grad;
      Tensor out = src.detach();
      if (dtype) out = cast(out, *dtype);
      out = to(out, dev);
      return out.defined() && out.device() == src.device() && out.dtype() == src.dtype() ? contiguous(out)
                                                                                         : out;
    });
  }
  const Device dev = device ? *device : to_device(py::none());
  if (PyObject_CheckBuffer(data.ptr())) return from_buffer(data, dev, dtype);
  if (py::hasattr(data, "__dlpack__")) {
    // A copy, like torch.tensor(): import (zero-copy where possible), then copy.
    Tensor view = import_dlpack(data, dev, false);
    return nogil([&] {
      Tensor out = contiguous(view);
      return dtype ? cast(out, *dtype) : out;
    });
  }
  if (py::hasattr(data, "__array__") && !is_sequence(data)) {
    py::object array = data.attr("__array__")();
    if (PyObject_CheckBuffer(array.ptr())) return from_buffer(array, dev, dtype);
  }
  return from_values(data, dev, dtype);
}

Tensor as_operand(py::handle obj, const Tensor& like) {
  if (is_pytensor(obj)) return as_pytensor(obj).t;
  if (PyBool_Check(obj.ptr()) || PyLong_Check(obj.ptr()) || PyFloat_Check(obj.ptr())) {
    const double v = PyFloat_AsDouble(obj.ptr());
    if (v == -1.0 && PyErr_Occurred()) throw py::error_already_set();
    const DType d = like.dtype();
    const bool integral = d != DType::f32 && d != DType::f64 && d != DType::f16 && d != DType::bf16;
    // No implicit promotion (ops.hpp): a fractional scalar is no integer tensor's operand.
    if (integral && PyFloat_Check(obj.ptr()) && v != std::trunc(v))
      invalid("the scalar " + std::string(py::repr(obj)) + " is not a value of " + std::string(to_string(d)) +
              " (there is no implicit promotion: cast the tensor first, e.g. t.astype(\"f32\"))");
    return nogil([&] { return full(like.device(), Shape{}, v, d); });
  }
  return make_tensor(obj, like.device(), like.dtype());
}

namespace {

using Binary = Tensor (*)(const Tensor&, const Tensor&);
using Unary = Tensor (*)(const Tensor&);

// A binary op with at least one tensor operand; the other may be a scalar,
// a list or an array, made a tensor of the tensor operand's dtype and device.
template <Binary F>
PyTensor binary(py::handle a, py::handle b) {
  Tensor x, y;
  if (is_pytensor(a)) {
    x = as_pytensor(a).t;
    y = as_operand(b, x);
  } else if (is_pytensor(b)) {
    y = as_pytensor(b).t;
    x = as_operand(a, y);
  } else {
    x = make_tensor(a, std::nullopt, std::nullopt);
    y = as_operand(b, x);
  }
  return PyTensor(nogil([&] { return F(x, y); }));
}

template <Unary F>
PyTensor unary(const PyTensor& t) {
  return PyTensor(nogil([&] { return F(t.t); }));
}

// Normalises the axes of a reduction (None: all; an int; a sequence).
std::optional<std::vector<int64_t>> to_axes(py::handle axis) {
  if (axis.is_none()) return std::nullopt;
  return to_int_vector(axis);
}

using AxisReduce = Tensor (*)(const Tensor&, int64_t, bool);
using AllReduce = Tensor (*)(const Tensor&);

// Over several axes: one after another, from the highest (so that the
// remaining indices stay valid without keepdim).
template <AxisReduce FA, AllReduce FALL>
PyTensor reduce(const PyTensor& t, py::handle axis, bool keepdim) {
  const std::optional<std::vector<int64_t>> axes = to_axes(axis);
  const Tensor& x = t.t;
  return PyTensor(nogil([&] {
    if (!axes) {
      if (!keepdim) return FALL(x);
      Tensor out = FALL(x);
      return reshape(out, std::vector<int64_t>(static_cast<std::size_t>(x.rank()), 1));
    }
    std::vector<int64_t> sorted = *axes;
    for (int64_t& a : sorted)
      if (a < 0) a += x.rank();
    std::sort(sorted.begin(), sorted.end(), std::greater<>());
    if (std::adjacent_find(sorted.begin(), sorted.end()) != sorted.end())
      throw Error(Errc::invalid_argument, "reduction: an axis appears twice");
    if (sorted.empty()) return x;
    Tensor out = x;
    for (int64_t a : sorted) out = FA(out, a, keepdim);
    return out;
  }));
}

template <AxisReduce FA, AllReduce FALL>
PyTensor arg_reduce(const PyTensor& t, py::handle axis, bool keepdim) {
  if (axis.is_none()) {
    if (keepdim) invalid("argmax/argmin over all axes: keepdim needs an axis");
    return PyTensor(nogil([&] { return FALL(t.t); }));
  }
  const int64_t a = axis.cast<int64_t>();
  return PyTensor(nogil([&] { return FA(t.t, a, keepdim); }));
}

std::vector<int64_t> dims_from_args(const py::args& args) {
  if (args.size() == 1 && !PyLong_Check(args[0].ptr())) return to_int_vector(args[0]);
  return to_int_vector(args);
}

std::string repr(const Tensor& t) {
  if (!t.defined()) return "tensor(<undefined>)";
  std::string s = "tensor(";
  if (t.numel() <= 64) {
    s += std::string(py::repr(tolist(t)));
  } else {
    s += "<" + std::to_string(t.numel()) + " elements>, shape=" + t.shape().to_string();
  }
  s += ", dtype=" + std::string(to_string(t.dtype())) + ", device=" + t.device().id();
  if (t.requires_grad()) s += ", requires_grad=True";
  return s + ")";
}

void set_requires_grad(PyTensor& self, bool flag) {
  if (flag) {
    self.require_grad();  // Errc::dtype_mismatch for a dtype other than f32/f64
  } else if (self.t.requires_grad()) {
    invalid("requires_grad cannot be turned off on " + self.t.to_string() +
            "; use t.detach() for the same data outside the graph");
  }
}

// A new tensor as a Python object, marked (and tracked) when requires_grad.
py::object with_grad(PyTensor t, bool requires_grad) {
  py::object obj = py::cast(std::move(t));
  if (requires_grad) set_requires_grad(as_pytensor(obj), true);
  return obj;
}

// The no_grad() context: a NoGradGuard for the with block, on the thread
// that entered it.
class NoGradContext {
 public:
  void enter() {
    if (guard_) invalid("no_grad(): this context is already entered");
    guard_ = std::make_unique<NoGradGuard>();
  }
  void exit() { guard_.reset(); }

 private:
  std::unique_ptr<NoGradGuard> guard_;
};

}  // namespace

namespace {

// The class itself: construction, properties, conversion to Python and
// NumPy, autodiff.
void bind_tensor_class(py::class_<PyTensor>& cls) {
  cls.def(py::init([](py::handle data, py::handle device, py::handle dtype, bool requires_grad) {
            auto out = std::make_unique<PyTensor>(
                make_tensor(data, device.is_none() ? std::nullopt : std::optional<Device>(to_device(device)),
                            to_optional_dtype(dtype)));
            if (requires_grad) out->require_grad();  // the object's final address: tracked as it is
            return out;
          }),
          py::arg("data"), py::arg("device") = py::none(), py::arg("dtype") = py::none(),
          py::arg("requires_grad") = false)
      // Identity hashing (== is elementwise), as torch.Tensor.
      .def("__hash__", [](py::handle self) { return reinterpret_cast<intptr_t>(self.ptr()); })
      // Makes NumPy hand `array OP tensor` to the tensor's reflected operator.
      .def_property_readonly_static("__array_ufunc__", [](py::handle) { return py::none(); })
      .def_property_readonly("shape",
                             [](const PyTensor& t) { return py::tuple(py::cast(t.t.shape().to_vector())); })
      .def_property_readonly("strides",
                             [](const PyTensor& t) { return py::tuple(py::cast(t.t.strides().to_vector())); })
      .def_property_readonly("ndim", [](const PyTensor& t) { return t.t.rank(); })
      .def_property_readonly("dtype", [](const PyTensor& t) { return t.t.dtype(); })
      .def_property_readonly("device", [](const PyTensor& t) { return t.t.device(); })
      .def_property_readonly("nbytes", [](const PyTensor& t) { return t.t.nbytes(); })
      .def_property_readonly("itemsize", [](const PyTensor& t) { return dtype_size(t.t.dtype()); })
      .def("numel", [](const PyTensor& t) { return t.t.numel(); })
      .def(
          "size",
          [](const PyTensor& t, py::handle dim) -> py::object {
            if (dim.is_none()) return py::tuple(py::cast(t.t.shape().to_vector()));
            int64_t d = dim.cast<int64_t>();
            if (d < 0) d += t.t.rank();
            if (d < 0 || d >= t.t.rank()) throw py::index_error("dimension out of range");
            return py::int_(t.t.shape()[static_cast<int>(d)]);
          },
          py::arg("dim") = py::none())
      .def("is_contiguous", [](const PyTensor& t) { return t.t.is_contiguous(); })
      .def("__len__",
           [](const PyTensor& t) {
             if (t.t.rank() == 0) throw py::type_error("len() of a 0-d tensor");
             return t.t.shape()[0];
           })
      .def("tolist", [](const PyTensor& t) { return tolist(t.t); })
      .def("item", [](const PyTensor& t) { return item(t.t); })
      .def("__float__", [](const PyTensor& t) { return item(t.t).cast<double>(); })
      .def("__int__", [](const PyTensor& t) { return py::int_(item(t.t)); })
      .def("__index__",
           [](const PyTensor& t) {
             const DType d = t.t.dtype();
             if (d != DType::i32 && d != DType::i64 && d != DType::u8 && d != DType::i8 && d != DType::bool_)
               throw py::type_error("only integer tensors of one element can be used as an index");
             return py::int_(item(t.t));
           })
      .def("__bool__",
           [](const PyTensor& t) {
             if (t.t.numel() != 1)
               invalid("the truth value of a tensor of " + std::to_string(t.t.numel()) +
                       " elements is ambiguous");
             return py::bool_(item(t.t)).cast<bool>();
           })
      .def("__repr__", [](const PyTensor& t) { return repr(t.t); })
      .def("to_string", [](const PyTensor& t) { return t.t.to_string(); })
      .def("contiguous", [](const PyTensor& t) { return PyTensor(nogil([&] { return contiguous(t.t); })); })
      .def("clone", [](const PyTensor& t) { return PyTensor(nogil([&] { return contiguous(t.t); })); })
      .def(
          "astype",
          [](const PyTensor& t, py::handle dtype) {
            const DType d = to_dtype(dtype);
            return PyTensor(nogil([&] { return cast(t.t, d); }));
          },
          py::arg("dtype"))
      .def(
          "to",
          [](const PyTensor& t, py::handle first, py::handle dtype) {
            // to(device), to(dtype), to(device, dtype)
            std::optional<Device> dev;
            std::optional<DType> dt = to_optional_dtype(dtype);
            if (!first.is_none()) {
              if (py::isinstance<Device>(first) || py::isinstance<Backend>(first)) {
                dev = to_device(first);
              } else if (py::isinstance<py::str>(first)) {
                try {
                  dt = to_dtype(first);
                } catch (const Error&) {
                  dev = to_device(first);
                }
              } else {
                dt = to_dtype(first);
              }
            }
            return PyTensor(nogil([&] {
              Tensor out = t.t;
              if (dt) out = cast(out, *dt);
              if (dev) out = to(out, *dev);
              return out;
            }));
          },
          py::arg("device_or_dtype") = py::none(), py::arg("dtype") = py::none())
      .def(
          "copy_",
          [](py::object self, py::handle src) {
            PyTensor& dst = as_pytensor(self);
            const Tensor s = as_operand(src, dst.t);
            nogil([&] { dst.t.copy_(s); });
            return self;
          },
          py::arg("src"))
      .def(
          "axpby_",
          [](py::object self, double alpha, const PyTensor& x, double beta) {
            PyTensor& y = as_pytensor(self);
            nogil([&] { axpby_(y.t, alpha, x.t, beta); });
            return self;
          },
          py::arg("alpha"), py::arg("x"), py::arg("beta"))
      // ---- autodiff
      .def_property(
          "requires_grad", [](const PyTensor& t) { return t.t.requires_grad(); }, &set_requires_grad)
      .def(
          "requires_grad_",
          [](py::object self, bool flag) {
            set_requires_grad(as_pytensor(self), flag);
            return self;
          },
          py::arg("requires_grad") = true)
      .def_property(
          "grad",
          [](const PyTensor& t) -> py::object {
            if (!t.grad) return py::none();
            return wrap(*t.grad);
          },
          [](PyTensor& t, py::handle g) {
            if (g.is_none()) {
              t.grad.reset();
              return;
            }
            Tensor grad = as_operand(g, t.t);
            if (!(grad.shape() == t.t.shape()) || grad.dtype() != t.t.dtype())
              throw Error(Errc::shape_mismatch,
                          "grad must match the tensor: " + grad.to_string() + " for " + t.t.to_string());
            t.grad = grad;
          })
      .def("detach", [](const PyTensor& t) { return PyTensor(t.t.detach()); })
      .def(
          "backward",
          [](const PyTensor& t, py::handle gradient, bool retain_graph) {
            BackwardOptions options;
            if (!gradient.is_none()) options.gradient = as_operand(gradient, t.t);
            options.retain_graph = retain_graph;
            const Gradients grads = nogil([&] { return t.t.backward(options); });
            deliver_gradients(grads);
          },
          py::arg("gradient") = py::none(), py::arg("retain_graph") = false,
          "Computes the gradients of this tensor (a loss) and adds each leaf's to its .grad");
}

// Python's operators (+, -, *, /, **, @, comparisons, unary).
void bind_operators(py::class_<PyTensor>& cls) {
  cls.def("__add__", &binary<add>)
      .def("__radd__", [](py::handle a, py::handle b) { return binary<add>(b, a); })
      .def("__sub__", &binary<sub>)
      .def("__rsub__", [](py::handle a, py::handle b) { return binary<sub>(b, a); })
      .def("__mul__", &binary<mul>)
      .def("__rmul__", [](py::handle a, py::handle b) { return binary<mul>(b, a); })
      .def("__truediv__", &binary<div>)
      .def("__rtruediv__", [](py::handle a, py::handle b) { return binary<div>(b, a); })
      .def("__pow__", &binary<pow>)
      .def("__rpow__", [](py::handle a, py::handle b) { return binary<pow>(b, a); })
      .def("__matmul__", &binary<matmul>)
      .def("__rmatmul__", [](py::handle a, py::handle b) { return binary<matmul>(b, a); })
      // `t == None` is False (and != True), as for any Python object, not an error.
      .def("__eq__",
           [](py::handle a, py::handle b) -> py::object {
             if (b.is_none()) return py::reinterpret_borrow<py::object>(Py_NotImplemented);
             return py::cast(binary<eq>(a, b));
           })
      .def("__ne__",
           [](py::handle a, py::handle b) -> py::object {
             if (b.is_none()) return py::reinterpret_borrow<py::object>(Py_NotImplemented);
             return py::cast(binary<ne>(a, b));
           })
      .def("__lt__", &binary<lt>)
      .def("__le__", &binary<le>)
      .def("__gt__", &binary<gt>)
      .def("__ge__", &binary<ge>)
      .def("__neg__", &unary<neg>)
      .def("__pos__", [](py::object self) { return self; })
      .def("__abs__", &unary<abs>);
}

// Element-wise ops and reductions, each a method and a module function.
void bind_elementwise(py::class_<PyTensor>& cls, py::module_& m) {
  auto both_unary = [&](const char* name, PyTensor (*f)(const PyTensor&)) {
    cls.def(name, f);
    m.def(name, f, py::arg("t"));
  };
  both_unary("neg", &unary<neg>);
  both_unary("abs", &unary<abs>);
  both_unary("exp", &unary<exp>);
  both_unary("log", &unary<log>);
  both_unary("sqrt", &unary<sqrt>);
  both_unary("tanh", &unary<tanh>);
  both_unary("sigmoid", &unary<sigmoid>);
  both_unary("relu", &unary<relu>);
  both_unary("sin", &unary<sin>);
  both_unary("cos", &unary<cos>);
  both_unary("erf", &unary<erf>);
  auto both_binary = [&](const char* name, PyTensor (*f)(py::handle, py::handle)) {
    cls.def(name, f, py::arg("other"));
    m.def(name, f, py::arg("a"), py::arg("b"));
  };
  both_binary("add", &binary<add>);
  both_binary("sub", &binary<sub>);
  both_binary("mul", &binary<mul>);
  both_binary("div", &binary<div>);
  both_binary("pow", &binary<pow>);
  both_binary("maximum", &binary<maximum>);
  both_binary("minimum", &binary<minimum>);
  both_binary("eq", &binary<eq>);
  both_binary("ne", &binary<ne>);
  both_binary("lt", &binary<lt>);
  both_binary("le", &binary<le>);
  both_binary("gt", &binary<gt>);
  both_binary("ge", &binary<ge>);
  both_binary("matmul", &binary<matmul>);

  auto clamp_fn = [](const PyTensor& t, double lo, double hi) {
    return PyTensor(nogil([&] { return clamp(t.t, lo, hi); }));
  };
  cls.def("clamp", clamp_fn, py::arg("lo"), py::arg("hi"));
  m.def("clamp", clamp_fn, py::arg("t"), py::arg("lo"), py::arg("hi"));

  auto both_reduce = [&](const char* name, PyTensor (*f)(const PyTensor&, py::handle, bool)) {
    cls.def(name, f, py::arg("axis") = py::none(), py::arg("keepdim") = false);
    m.def(name, f, py::arg("t"), py::arg("axis") = py::none(), py::arg("keepdim") = false);
  };
  both_reduce("sum", &reduce<static_cast<AxisReduce>(&sum), static_cast<AllReduce>(&sum)>);
  both_reduce("mean", &reduce<static_cast<AxisReduce>(&mean), static_cast<AllReduce>(&mean)>);
  both_reduce("max", &reduce<static_cast<AxisReduce>(&max), static_cast<AllReduce>(&max)>);
  both_reduce("min", &reduce<static_cast<AxisReduce>(&min), static_cast<AllReduce>(&min)>);
  both_reduce("argmax", &arg_reduce<static_cast<AxisReduce>(&argmax), static_cast<AllReduce>(&argmax)>);
  both_reduce("argmin", &arg_reduce<static_cast<AxisReduce>(&argmin), static_cast<AllReduce>(&argmin)>);

  auto softmax_fn = [](const PyTensor& t, int64_t axis) {
    return PyTensor(nogil([&] { return softmax(t.t, axis); }));
  };
  auto log_softmax_fn = [](const PyTensor& t, int64_t axis) {
    return PyTensor(nogil([&] { return log_softmax(t.t, axis); }));
  };
  cls.def("softmax", softmax_fn, py::arg("axis") = -1)
      .def("log_softmax", log_softmax_fn, py::arg("axis") = -1);
  m.def("softmax", softmax_fn, py::arg("t"), py::arg("axis") = -1);
  m.def("log_softmax", log_softmax_fn, py::arg("t"), py::arg("axis") = -1);
}

// reshape, permute, transpose, slice, index_select, gather and the other shape ops.
void bind_shape_ops(py::class_<PyTensor>& cls, py::module_& m) {
  cls.def("reshape", [](const PyTensor& t, const py::args& shape) {
    const std::vector<int64_t> dims = dims_from_args(shape);
    return PyTensor(nogil([&] { return reshape(t.t, dims); }));
  });
  m.def(
      "reshape",
      [](const PyTensor& t, py::handle shape) {
        const std::vector<int64_t> dims = to_int_vector(shape);
        return PyTensor(nogil([&] { return reshape(t.t, dims); }));
      },
      py::arg("t"), py::arg("shape"));
  cls.def("permute", [](const PyTensor& t, const py::args& dims) {
    const std::vector<int64_t> d = dims_from_args(dims);
    return PyTensor(nogil([&] { return permute(t.t, d); }));
  });
  m.def(
      "permute",
      [](const PyTensor& t, py::handle dims) {
        const std::vector<int64_t> d = to_int_vector(dims);
        return PyTensor(nogil([&] { return permute(t.t, d); }));
      },
      py::arg("t"), py::arg("dims"));
  auto transpose_fn = [](const PyTensor& t, int64_t d0, int64_t d1) {
    return PyTensor(nogil([&] { return transpose(t.t, d0, d1); }));
  };
  cls.def("transpose", transpose_fn, py::arg("dim0"), py::arg("dim1"));
  m.def("transpose", transpose_fn, py::arg("t"), py::arg("dim0"), py::arg("dim1"));
  cls.def_property_readonly("T", [](const PyTensor& t) {
    std::vector<int64_t> dims(static_cast<std::size_t>(t.t.rank()));
    for (std::size_t i = 0; i < dims.size(); ++i) dims[i] = static_cast<int64_t>(dims.size() - 1 - i);
    return PyTensor(nogil([&] { return permute(t.t, dims); }));
  });
  auto slice_fn = [](const PyTensor& t, int64_t axis, int64_t start, int64_t end, int64_t step) {
    return PyTensor(nogil([&] { return slice(t.t, axis, start, end, step); }));
  };
  cls.def("slice", slice_fn, py::arg("axis"), py::arg("start"), py::arg("end"), py::arg("step") = 1);
  m.def("slice", slice_fn, py::arg("t"), py::arg("axis"), py::arg("start"), py::arg("end"),
        py::arg("step") = 1);
  auto index_select_fn = [](const PyTensor& t, int64_t axis, py::handle index) {
    const Tensor i = is_pytensor(index) ? as_pytensor(index).t : make_tensor(index, t.t.device(), DType::i64);
    return PyTensor(nogil([&] { return index_select(t.t, axis, i); }));
  };
  cls.def("index_select", index_select_fn, py::arg("axis"), py::arg("index"));
  m.def("index_select", index_select_fn, py::arg("t"), py::arg("axis"), py::arg("index"));
  auto gather_fn = [](const PyTensor& t, int64_t axis, py::handle index) {
    const Tensor i = is_pytensor(index) ? as_pytensor(index).t : make_tensor(index, t.t.device(), DType::i64);
    return PyTensor(nogil([&] { return gather(t.t, axis, i); }));
  };
  cls.def("gather", gather_fn, py::arg("axis"), py::arg("index"));
  m.def("gather", gather_fn, py::arg("t"), py::arg("axis"), py::arg("index"));
  m.def(
      "cat",
      [](const std::vector<const PyTensor*>& tensors, int64_t axis) {
        std::vector<Tensor> ts;
        for (const PyTensor* p : tensors) ts.push_back(p->t);
        return PyTensor(nogil([&] { return cat(ts, axis); }));
      },
      py::arg("tensors"), py::arg("axis") = 0);
  m.def(
      "where",
      [](py::handle cond, py::handle a, py::handle b) {
        Tensor x, y;
        if (is_pytensor(a)) {
          x = as_pytensor(a).t;
          y = as_operand(b, x);
        } else if (is_pytensor(b)) {
          y = as_pytensor(b).t;
          x = as_operand(a, y);
        } else {
          x = make_tensor(a, std::nullopt, std::nullopt);
          y = as_operand(b, x);
        }
        const Tensor c =
            is_pytensor(cond) ? as_pytensor(cond).t : make_tensor(cond, x.device(), DType::bool_);
        return PyTensor(nogil([&] { return where(c, x, y); }));
      },
      py::arg("cond"), py::arg("a"), py::arg("b"));
  m.def(
      "contiguous", [](const PyTensor& t) { return PyTensor(nogil([&] { return contiguous(t.t); })); },
      py::arg("t"));
  m.def(
      "cast",
      [](const PyTensor& t, py::handle dtype) {
        const DType d = to_dtype(dtype);
        return PyTensor(nogil([&] { return cast(t.t, d); }));
      },
      py::arg("t"), py::arg("dtype"));
  m.def(
      "to",
      [](const PyTensor& t, py::handle device) {
        const Device d = to_device(device);
        return PyTensor(nogil([&] { return to(t.t, d); }));
      },
      py::arg("t"), py::arg("device"));
  m.def(
      "broadcast_shapes",
      [](py::handle a, py::handle b) {
        return py::tuple(py::cast(broadcast_shapes(to_shape(a), to_shape(b)).to_vector()));
      },
      py::arg("a"), py::arg("b"));
}

// tensor(), zeros, ones, full, arange, rand_uniform and randn: making tensors.
void bind_creation(py::module_& m) {
  m.def(
      "tensor",
      [](py::handle data, py::handle device, py::handle dtype, bool requires_grad) {
        PyTensor out(make_tensor(data,
                                 device.is_none() ? std::nullopt : std::optional<Device>(to_device(device)),
                                 to_optional_dtype(dtype)));
        py::object obj = py::cast(std::move(out));
        if (requires_grad) set_requires_grad(as_pytensor(obj), true);
        return obj;
      },
      py::arg("data"), py::kw_only(), py::arg("device") = py::none(), py::arg("dtype") = py::none(),
      py::arg("requires_grad") = false,
      "A new tensor (a copy) from nested lists, a scalar, a buffer, or any array (NumPy, torch, __dlpack__)");
  auto creation = [&](const char* name, Tensor (*f)(const Device&, const Shape&, DType), const char* doc) {
    m.def(
        name,
        [f](py::handle shape, py::handle device, py::handle dtype, bool requires_grad) {
          const Device d = to_device(device);
          const Shape s = to_shape(shape);
          const DType t = dtype.is_none() ? DType::f32 : to_dtype(dtype);
          return with_grad(PyTensor(nogil([&] { return f(d, s, t); })), requires_grad);
        },
        py::arg("shape"), py::kw_only(), py::arg("device") = py::none(), py::arg("dtype") = py::none(),
        py::arg("requires_grad") = false, doc);
  };
  creation("zeros", static_cast<Tensor (*)(const Device&, const Shape&, DType)>(&zeros), "A tensor of zeros");
  creation("ones", static_cast<Tensor (*)(const Device&, const Shape&, DType)>(&ones), "A tensor of ones");
  creation("empty", &Tensor::empty, "A tensor whose contents are unspecified");
  m.def(
      "full",
      [](py::handle shape, double value, py::handle device, py::handle dtype, bool requires_grad) {
        const Device d = to_device(device);
        const Shape s = to_shape(shape);
        const DType t = dtype.is_none() ? DType::f32 : to_dtype(dtype);
        return with_grad(PyTensor(nogil([&] { return full(d, s, value, t); })), requires_grad);
      },
      py::arg("shape"), py::arg("value"), py::kw_only(), py::arg("device") = py::none(),
      py::arg("dtype") = py::none(), py::arg("requires_grad") = false);
  m.def(
      "arange",
      [](double start, std::optional<double> end, double step, py::handle device, py::handle dtype) {
        const Device d = to_device(device);
        const DType t = dtype.is_none() ? DType::f32 : to_dtype(dtype);
        const double lo = end ? start : 0.0;
        const double hi = end ? *end : start;
        return PyTensor(nogil([&] { return arange(d, lo, hi, step, t); }));
      },
      py::arg("start"), py::arg("end") = py::none(), py::arg("step") = 1.0, py::kw_only(),
      py::arg("device") = py::none(), py::arg("dtype") = py::none(),
      "[start, end) in steps of step; arange(n) is [0, n)");
  m.def(
      "rand_uniform",
      [](py::handle shape, uint64_t seed, double low, double high, py::handle device, py::handle dtype,
         bool requires_grad) {
        const Device d = to_device(device);
        const Shape s = to_shape(shape);
        const DType t = dtype.is_none() ? DType::f32 : to_dtype(dtype);
        return with_grad(PyTensor(nogil([&] { return rand_uniform(d, s, seed, low, high, t); })),
                         requires_grad);
      },
      py::arg("shape"), py::arg("seed"), py::arg("low") = 0.0, py::arg("high") = 1.0, py::kw_only(),
      py::arg("device") = py::none(), py::arg("dtype") = py::none(), py::arg("requires_grad") = false);
  m.def(
      "randn",
      [](py::handle shape, uint64_t seed, double mean, double stddev, py::handle device, py::handle dtype,
         bool requires_grad) {
        const Device d = to_device(device);
        const Shape s = to_shape(shape);
        const DType t = dtype.is_none() ? DType::f32 : to_dtype(dtype);
        return with_grad(PyTensor(nogil([&] { return randn(d, s, seed, mean, stddev, t); })), requires_grad);
      },
      py::arg("shape"), py::arg("seed"), py::arg("mean") = 0.0, py::arg("stddev") = 1.0, py::kw_only(),
      py::arg("device") = py::none(), py::arg("dtype") = py::none(), py::arg("requires_grad") = false);
}

// no_grad and is_grad_enabled.
void bind_grad_mode(py::module_& m) {
  py::class_<NoGradContext>(m, "_NoGradContext")
      .def(py::init<>())
      .def("__enter__", [](NoGradContext& c) { c.enter(); })
      .def("__exit__", [](NoGradContext& c, py::args) {
        c.exit();
        return false;
      });
  m.def("is_grad_enabled", &grad_enabled, "Whether ops record for autodiff on this thread");
}

}  // namespace

void bind_tensor(py::module_& m) {
  py::class_<PyTensor> cls(m, "Tensor", py::buffer_protocol(),
                           "A typed, shaped view of a plugin buffer on one device");
  g_tensor_type = reinterpret_cast<PyTypeObject*>(cls.ptr());
  bind_tensor_class(cls);
  bind_operators(cls);
  bind_elementwise(cls, m);
  bind_shape_ops(cls, m);
  bind_creation(m);
  bind_grad_mode(m);
}

}  // namespace backplane::python
