// Distributed training from Python: DistributedParamId and
// set_distributed_params (the capability lookup), Rendezvous, ProcessGroup
// and its collectives, ReduceOp, and the data-parallel gradient
// synchronisation (init_distributed). Collectives and group creation block
// until every rank arrives: they run with the GIL released, so other Python
// threads (another rank's, in a test) keep running meanwhile.
#include "common.hpp"

#include <pybind11/chrono.h>

#include <chrono>

namespace backplane::python {
namespace {

std::chrono::milliseconds seconds_to_ms(double seconds) {
  if (!(seconds > 0)) throw Error(Errc::invalid_argument, "a timeout must be a positive number of seconds");
  return std::chrono::milliseconds(static_cast<int64_t>(seconds * 1000.0 + 0.5));
}

ReduceOp to_reduce_op(py::handle obj) {
  if (py::isinstance<ReduceOp>(obj)) return obj.cast<ReduceOp>();
  const std::string name = py::str(obj);
  for (ReduceOp op : {ReduceOp::sum, ReduceOp::mean, ReduceOp::min, ReduceOp::max, ReduceOp::prod})
    if (name == to_string(op)) return op;
  throw Error(Errc::invalid_argument, "unknown reduce op \"" + name + "\"; use sum, mean, min, max or prod");
}

DistributedParamId to_param_id(py::handle obj) {
  if (py::isinstance<DistributedParamId>(obj)) return obj.cast<DistributedParamId>();
  return DistributedParamId{obj.cast<uint64_t>()};
}

}  // namespace

void bind_distributed(py::module_& m) {
  py::class_<DistributedParamId>(m, "DistributedParamId",
                                 "Identifies one parameter across the ranks: every rank uses the same id")
      .def(py::init([](uint64_t value) { return DistributedParamId{value}; }), py::arg("value"))
      .def_readonly("value", &DistributedParamId::value)
      .def("__int__", [](const DistributedParamId& id) { return id.value; })
      .def("__eq__",
           [](const DistributedParamId& a, py::handle b) {
             return py::isinstance<DistributedParamId>(b) && a == b.cast<DistributedParamId>();
           })
      .def("__hash__", [](const DistributedParamId& id) { return py::hash(py::int_(id.value)); })
      .def("__repr__", [](const DistributedParamId& id) {
        return "DistributedParamId(" + std::to_string(id.value) + ")";
      });
  py::class_<DistributedParams>(m, "DistributedParams")
      .def_readonly("param_id", &DistributedParams::param_id)
      .def("__repr__", [](const DistributedParams& p) {
        return "DistributedParams(param_id=DistributedParamId(" + std::to_string(p.param_id.value) + "))";
      });

  m.def(
      "set_distributed_params",
      [](py::object t, py::handle id) {
        PyTensor& p = as_pytensor(t);
        const DistributedParamId pid = to_param_id(id);
        p.t = nogil([&] { return set_distributed_params(p.t, pid); });
        return t;
      },
      py::arg("tensor"), py::arg("param_id"),
      "Marks tensor as a data-parallel parameter and returns it; CapabilityMissing (or the backend's "
      "collective_fallback) when its device lacks 'collective'");
  m.def(
      "distributed_params", [](const PyTensor& t) { return distributed_params(t.t); }, py::arg("tensor"));
  m.def(
      "is_distributed", [](const PyTensor& t) { return is_distributed(t.t); }, py::arg("tensor"));

  py::class_<Store, std::shared_ptr<Store>>(m, "Store", "The job's key-value store (Rendezvous.store())")
      .def(
          "set",
          [](Store& s, const std::string& key, const py::bytes& value) {
            const std::string v = value;
            nogil([&] { s.set(key, std::vector<uint8_t>(v.begin(), v.end())); });
          },
          py::arg("key"), py::arg("value"))
      .def(
          "get",
          [](Store& s, const std::string& key, std::optional<double> timeout) {
            const auto t = timeout ? seconds_to_ms(*timeout) : s.timeout();
            const std::vector<uint8_t> v = nogil([&] { return s.get(key, t); });
            return py::bytes(reinterpret_cast<const char*>(v.data()), v.size());
          },
          py::arg("key"), py::arg("timeout") = py::none())
      .def(
          "add",
          [](Store& s, const std::string& key, int64_t delta) {
            return nogil([&] { return s.add(key, delta); });
          },
          py::arg("key"), py::arg("delta"))
      .def(
          "check",
          [](Store& s, const std::vector<std::string>& keys) { return nogil([&] { return s.check(keys); }); },
          py::arg("keys"))
      .def(
          "wait",
          [](Store& s, const std::vector<std::string>& keys, std::optional<double> timeout) {
            const auto t = timeout ? seconds_to_ms(*timeout) : s.timeout();
            nogil([&] { s.wait(keys, t); });
          },
          py::arg("keys"), py::arg("timeout") = py::none())
      .def(
          "remove", [](Store& s, const std::string& key) { return nogil([&] { return s.remove(key); }); },
          py::arg("key"))
      .def_property_readonly("address", &Store::address);

  py::class_<Rendezvous>(m, "Rendezvous",
                         "Where this process sits in a job, and the store that joins the job")
      .def(py::init([](int32_t rank, int32_t world_size, std::string master_addr, uint16_t master_port,
                       double timeout, int32_t local_rank) {
             return Rendezvous(rank, world_size, std::move(master_addr), master_port, seconds_to_ms(timeout),
                               local_rank);
           }),
           py::arg("rank"), py::arg("world_size"), py::arg("master_addr") = "127.0.0.1",
           py::arg("master_port") = 29500, py::arg("timeout") = 300.0, py::arg("local_rank") = -1)
      .def_static("from_env", &Rendezvous::from_env,
                  "From RANK/WORLD_SIZE (backplane launch, torchrun), Open MPI's or Slurm's variables, and "
                  "MASTER_ADDR, MASTER_PORT, BACKPLANE_TIMEOUT")
      .def_static(
          "single_process", [](double timeout) { return Rendezvous::single_process(seconds_to_ms(timeout)); },
          py::arg("timeout") = 300.0)
      .def_property_readonly("rank", &Rendezvous::rank)
      .def_property_readonly("world_size", &Rendezvous::world_size)
      .def_property_readonly("local_rank", &Rendezvous::local_rank)
      .def_property_readonly("master_addr", &Rendezvous::master_addr)
      .def_property_readonly("master_port", &Rendezvous::master_port)
      .def_property_readonly(
          "timeout", [](const Rendezvous& r) { return std::chrono::duration<double>(r.timeout()).count(); })
      .def_property_readonly("source", &Rendezvous::source)
      .def("store", [](const Rendezvous& r) { return nogil([&] { return r.store(); }); })
      .def("__repr__", [](const Rendezvous& r) {
        return "Rendezvous(rank=" + std::to_string(r.rank()) +
               ", world_size=" + std::to_string(r.world_size()) + ", master=" + r.master_addr() + ":" +
               std::to_string(r.master_port()) + ", source=" + r.source() + ")";
      });

  py::enum_<ReduceOp>(m, "ReduceOp")
      .value("sum", ReduceOp::sum)
      .value("mean", ReduceOp::mean)
      .value("min", ReduceOp::min)
      .value("max", ReduceOp::max)
      .value("prod", ReduceOp::prod)
      .def("__str__", [](ReduceOp op) { return std::string(to_string(op)); });

  py::class_<ProcessGroup>(m, "ProcessGroup", "Collectives across the ranks of a job, on one device per rank")
      .def_static(
          "create",
          [](py::handle device, const Rendezvous& rv, std::optional<double> timeout) {
            const Device d = to_device(device);
            ProcessGroupOptions options;
            if (timeout) options.timeout = seconds_to_ms(*timeout);
            return nogil([&] { return ProcessGroup::create(d, rv, options); });
          },
          py::arg("device"), py::arg("rendezvous"), py::arg("timeout") = py::none(),
          "Connects this rank's group on device with every other rank (blocks until all arrive)")
      .def_property_readonly("rank", &ProcessGroup::rank)
      .def_property_readonly("world_size", &ProcessGroup::world_size)
      .def_property_readonly("device", &ProcessGroup::device)
      .def_property_readonly("collective_device", &ProcessGroup::collective_device)
      .def_property_readonly("is_local", &ProcessGroup::is_local)
      .def_property_readonly(
          "timeout", [](const ProcessGroup& g) { return std::chrono::duration<double>(g.timeout()).count(); })
      .def(
          "all_reduce",
          [](ProcessGroup& g, const PyTensor& t, py::handle op) {
            const ReduceOp o = to_reduce_op(op);
            return PyTensor(nogil([&] { return g.all_reduce(t.t, o); }));
          },
          py::arg("tensor"), py::arg("op") = ReduceOp::sum)
      .def(
          "all_reduce_",
          [](ProcessGroup& g, py::object t, py::handle op) {
            const ReduceOp o = to_reduce_op(op);
            PyTensor& p = as_pytensor(t);
            nogil([&] { g.all_reduce_(p.t, o); });
            return t;
          },
          py::arg("tensor"), py::arg("op") = ReduceOp::sum,
          "In place: tensor must be contiguous and own its storage")
      .def(
          "broadcast",
          [](ProcessGroup& g, const PyTensor& t, int32_t root) {
            return PyTensor(nogil([&] { return g.broadcast(t.t, root); }));
          },
          py::arg("tensor"), py::arg("root") = 0)
      .def(
          "all_gather",
          [](ProcessGroup& g, const PyTensor& t) {
            return PyTensor(nogil([&] { return g.all_gather(t.t); }));
          },
          py::arg("tensor"))
      .def(
          "reduce_scatter",
          [](ProcessGroup& g, const PyTensor& t, py::handle op) {
            const ReduceOp o = to_reduce_op(op);
            return PyTensor(nogil([&] { return g.reduce_scatter(t.t, o); }));
          },
          py::arg("tensor"), py::arg("op") = ReduceOp::sum)
      .def("barrier", [](ProcessGroup& g) { nogil([&] { g.barrier(); }); })
      .def("abort", [](ProcessGroup& g) { nogil([&] { g.abort(); }); })
      .def("__repr__", [](const ProcessGroup& g) {
        if (!g.valid()) return std::string("ProcessGroup(<invalid>)");
        return "ProcessGroup(rank=" + std::to_string(g.rank()) +
               ", world_size=" + std::to_string(g.world_size()) + ", device=" + g.device().id() + ")";
      });

  py::class_<GradSyncStats>(m, "GradSyncStats")
      .def_readonly("collectives", &GradSyncStats::collectives)
      .def_readonly("gradients", &GradSyncStats::gradients)
      .def_readonly("bytes", &GradSyncStats::bytes)
      .def_readonly("seconds", &GradSyncStats::seconds)
      .def("__repr__", [](const GradSyncStats& s) {
        return "GradSyncStats(collectives=" + std::to_string(s.collectives) +
               ", gradients=" + std::to_string(s.gradients) + ", bytes=" + std::to_string(s.bytes) +
               ", seconds=" + std::to_string(s.seconds) + ")";
      });
  m.def(
      "init_distributed",
      [](const Rendezvous& rv, double bucket_mb) {
        GradSyncOptions options;
        if (!(bucket_mb > 0)) throw Error(Errc::invalid_argument, "bucket_mb must be positive");
        options.bucket_bytes = static_cast<std::size_t>(bucket_mb * 1024 * 1024);
        nogil([&] { init_distributed(rv, options); });
      },
      py::arg("rendezvous"), py::arg("bucket_mb") = 25.0,
      "From now on every backward() all-reduces (mean) the gradients of registered parameters");
  m.def("distributed_initialized", &distributed_initialized);
  m.def("shutdown_distributed", [] { nogil([] { shutdown_distributed(); }); });
  m.def(
      "distributed_group",
      [](py::handle device) {
        const Device d = to_device(device);
        return nogil([&] { return distributed_group(d); });
      },
      py::arg("device"));
  m.def("grad_sync_stats", &grad_sync_stats);
  m.def("reset_grad_sync_stats", &reset_grad_sync_stats);
}

}  // namespace backplane::python
