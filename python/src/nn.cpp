// The training toolkit (backplane.nn): Linear, cross_entropy, accuracy, and
// the SGD and Adam optimizers, over backplane::nn. The optimizers read the
// Python-side .grad of their parameters (what backward() delivered), as
// PyTorch's do, and zero_grad() clears it.
#include "common.hpp"

#include <memory>

namespace backplane::python {
namespace {

// nn::Linear with its parameters as Python tensors made once, so that
// model.weight is the same object on every access and receives .grad.
struct PyLinear {
  std::unique_ptr<nn::Linear> linear;
  py::object weight, bias;
};

struct PyOptimizer {
  std::unique_ptr<nn::Optimizer> optimizer;
  std::vector<py::object> params;

  void step() {
    Gradients grads;
    for (const py::object& p : params) {
      const PyTensor& t = as_pytensor(p);
      if (t.grad) grads.set(t.t, *t.grad);
    }
    nogil([&] { optimizer->step(grads); });
  }
  void zero_grad() {
    for (const py::object& p : params) as_pytensor(p).grad.reset();
  }
};

// The concrete optimizers, as distinct C++ types for pybind11.
struct PySGD : PyOptimizer {};
struct PyAdam : PyOptimizer {};

std::vector<py::object> to_params(py::iterable params) {
  std::vector<py::object> out;
  for (py::handle p : params) {
    if (!is_pytensor(p))
      throw Error(Errc::invalid_argument,
                  "an optimizer takes backplane tensors, got " + std::string(py::str(py::type::of(p))));
    out.push_back(py::reinterpret_borrow<py::object>(p));
  }
  return out;
}

std::vector<Tensor> tensors_of(const std::vector<py::object>& params) {
  std::vector<Tensor> out;
  for (const py::object& p : params) out.push_back(as_pytensor(p).t);
  return out;
}

py::object tracked_parameter(const Tensor& t) {
  py::object obj = wrap(t);
  as_pytensor(obj).require_grad();  // already a leaf requiring grad: this tracks the object
  return obj;
}

}  // namespace

void bind_nn(py::module_& root) {
  py::module_ m =
      root.def_submodule("nn", "The training toolkit: Linear, cross_entropy, accuracy, SGD, Adam");

  py::class_<PyLinear>(m, "Linear",
                       "y = x @ weight + bias; weight [in, out], bias [out], seeded like PyTorch's")
      .def(py::init([](int64_t in_features, int64_t out_features, uint64_t seed, py::handle device,
                       py::handle dtype) {
             const Device d = to_device(device);
             const DType t = dtype.is_none() ? DType::f32 : to_dtype(dtype);
             auto out = std::make_unique<PyLinear>();
             out->linear =
                 nogil([&] { return std::make_unique<nn::Linear>(d, in_features, out_features, seed, t); });
             out->weight = tracked_parameter(out->linear->weight());
             out->bias = tracked_parameter(out->linear->bias());
             return out;
           }),
           py::arg("in_features"), py::arg("out_features"), py::kw_only(), py::arg("seed") = 0,
           py::arg("device") = py::none(), py::arg("dtype") = py::none())
      .def(
          "__call__",
          [](const PyLinear& l, const PyTensor& x) {
            return PyTensor(nogil([&] { return (*l.linear)(x.t); }));
          },
          py::arg("x"))
      .def(
          "forward",
          [](const PyLinear& l, const PyTensor& x) {
            return PyTensor(nogil([&] { return (*l.linear)(x.t); }));
          },
          py::arg("x"))
      .def_property_readonly("weight", [](const PyLinear& l) { return l.weight; })
      .def_property_readonly("bias", [](const PyLinear& l) { return l.bias; })
      .def("parameters", [](const PyLinear& l) { return py::make_tuple(l.weight, l.bias).cast<py::list>(); })
      .def("__repr__", [](const PyLinear& l) {
        const Shape& s = l.linear->weight().shape();
        return "Linear(in_features=" + std::to_string(s[0]) + ", out_features=" + std::to_string(s[1]) + ")";
      });

  m.def(
      "cross_entropy",
      [](const PyTensor& logits, py::handle labels) {
        const Tensor y =
            is_pytensor(labels) ? as_pytensor(labels).t : make_tensor(labels, logits.t.device(), DType::i64);
        return PyTensor(nogil([&] { return nn::cross_entropy(logits.t, y); }));
      },
      py::arg("logits"), py::arg("labels"),
      "Mean over the batch of -log softmax(logits)[label]; labels are i64");
  m.def(
      "accuracy",
      [](const PyTensor& logits, py::handle labels) {
        const Tensor y =
            is_pytensor(labels) ? as_pytensor(labels).t : make_tensor(labels, logits.t.device(), DType::i64);
        return nogil([&] { return nn::accuracy(logits.t, y); });
      },
      py::arg("logits"), py::arg("labels"), "The fraction of rows whose argmax equals the label");

  py::class_<PyOptimizer>(m, "Optimizer", "Updates parameters in place from their .grad")
      .def("step", &PyOptimizer::step,
           "One update from each parameter's .grad (parameters without one are left)")
      .def("zero_grad", &PyOptimizer::zero_grad, "Clears every parameter's .grad")
      .def_property_readonly("parameters", [](const PyOptimizer& o) { return o.params; });
  py::class_<PySGD, PyOptimizer>(m, "SGD",
                                 "v = momentum * v + (g + weight_decay * p); p -= lr * v  (PyTorch's SGD)")
      .def(py::init([](py::iterable params, double lr, double momentum, double weight_decay) {
             auto out = std::make_unique<PySGD>();
             out->params = to_params(params);
             out->optimizer = std::make_unique<nn::SGD>(tensors_of(out->params), lr, momentum, weight_decay);
             return out;
           }),
           py::arg("params"), py::arg("lr"), py::arg("momentum") = 0.0, py::arg("weight_decay") = 0.0);
  py::class_<PyAdam, PyOptimizer>(m, "Adam", "Adam with bias correction (PyTorch's Adam)")
      .def(py::init([](py::iterable params, double lr, std::pair<double, double> betas, double eps) {
             auto out = std::make_unique<PyAdam>();
             out->params = to_params(params);
             out->optimizer =
                 std::make_unique<nn::Adam>(tensors_of(out->params), lr, betas.first, betas.second, eps);
             return out;
           }),
           py::arg("params"), py::arg("lr") = 1e-3, py::arg("betas") = std::make_pair(0.9, 0.999),
           py::arg("eps") = 1e-8);
}

}  // namespace backplane::python
