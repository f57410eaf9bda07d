// bp.save / bp.load / bp.load_with_metadata: safetensors files through the
// core's save_safetensors and load_safetensors (include/backplane/safetensors.hpp).
#include "common.hpp"

#include <backplane/safetensors.hpp>

#include <pybind11/stl/filesystem.h>

namespace backplane::python {
namespace {

void save(const std::filesystem::path& path, const py::dict& tensors, const py::object& metadata) {
  std::vector<std::pair<std::string, Tensor>> named;
  named.reserve(tensors.size());
  for (const auto& [key, value] : tensors) {
    if (!py::isinstance<py::str>(key))
      throw Error(Errc::invalid_argument,
                  "save: tensor names are str, not " + std::string(py::str(py::type::of(key))));
    // A backplane tensor as it is; anything backplane.tensor() takes (NumPy
    // arrays, lists) on the default device.
    Tensor t = py::isinstance<PyTensor>(value) ? value.cast<const PyTensor&>().t
                                               : make_tensor(value, std::nullopt, std::nullopt);
    named.emplace_back(utf8(key, "save: the tensor name"), std::move(t));
  }
  std::map<std::string, std::string> meta;
  if (!metadata.is_none()) {
    if (!py::isinstance<py::dict>(metadata))
      throw Error(Errc::invalid_argument, "save: metadata is a dict of str to str, not " +
                                              std::string(py::str(py::type::of(metadata))));
    for (const auto& [key, value] : metadata.cast<py::dict>()) {
      if (!py::isinstance<py::str>(key) || !py::isinstance<py::str>(value))
        throw Error(Errc::invalid_argument, "save: metadata is a dict of str to str, but it maps " +
                                                std::string(py::repr(key)) + " to " +
                                                std::string(py::repr(value)));
      meta.emplace(utf8(key, "save: the metadata key"), utf8(value, "save: the metadata value"));
    }
  }
  nogil([&] { save_safetensors(path, named, meta); });
}

py::dict tensors_of(SafetensorsFile& file) {
  py::dict out;
  for (auto& [name, t] : file.tensors) out[py::str(name)] = py::cast(PyTensor(std::move(t)));
  return out;
}

SafetensorsFile load(const std::filesystem::path& path, py::handle device, bool mmap) {
  const Device d = to_device(device);
  const SafetensorsLoad mode = mmap ? SafetensorsLoad::map_if_possible : SafetensorsLoad::copy;
  return nogil([&] { return load_safetensors(path, d, mode); });
}

}  // namespace

void bind_safetensors(py::module_& m) {
  m.def(
      "save", &save, py::arg("path"), py::arg("tensors"), py::arg("metadata") = py::none(),
      "Writes a dict of name -> tensor (and optional str -> str metadata) to a safetensors file, atomically; "
      "values that are not tensors go through backplane.tensor()");
  m.def(
      "load",
      [](const std::filesystem::path& path, py::handle device, bool mmap) {
        SafetensorsFile file = load(path, device, mmap);
        return tensors_of(file);
      },
      py::arg("path"), py::arg("device") = py::none(), py::kw_only(), py::arg("mmap") = false,
      "Reads a safetensors file: a dict of name -> tensor on `device` (default: the default device), in the "
      "file's order. The tensors are copies; mmap=True makes them views of a private map of the file where "
      "the device allows (nothing read until used), which change if the file is rewritten in place and "
      "kill the process (SIGBUS) if it is truncated");
  m.def(
      "load_with_metadata",
      [](const std::filesystem::path& path, py::handle device, bool mmap) {
        SafetensorsFile file = load(path, device, mmap);
        py::dict tensors = tensors_of(file);
        return py::make_tuple(tensors, py::cast(file.metadata));
      },
      py::arg("path"), py::arg("device") = py::none(), py::kw_only(), py::arg("mmap") = false,
      "As load(), and the file's \"__metadata__\": a (tensors, metadata) tuple");
}

}  // namespace backplane::python
