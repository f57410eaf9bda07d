// Cases of the shape ops (reshape permute transpose slice cat index_select
// gather), cast between every pair of dtypes, contiguous, and `to` (same
// device; across backends when a peer device is given). All exact.
#include "reference.hpp"
#include "suite.hpp"

#include <backplane/capability.hpp>
#include <backplane/ops.hpp>

#include <cmath>
#include <limits>

namespace backplane::conformance {
namespace {

using Dims = std::vector<int64_t>;

constexpr double kInf = std::numeric_limits<double>::infinity();
constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

const std::vector<DType> kAll = {DType::f32, DType::f64, DType::i32, DType::i64, DType::bool_};

HostTensor values(Rng& rng, DType dtype, const Dims& shape) {
  return random_host(rng, dtype, shape, is_float(dtype) ? -100 : -1000, is_float(dtype) ? 100 : 1000);
}

HostTensor indices(Dims shape, const std::vector<int64_t>& v) {
  return make_host_int(DType::i64, std::move(shape), v);
}

std::string dims_text(const std::vector<int64_t>& dims) { return shape_text(dims); }

void add_shape_op_cases(Cases& cases, DType dtype) {
  Rng rng(seed_of("shape" + std::string(to_string(dtype))));
  auto add = [&](const char* op, int32_t code, std::string name, std::function<Verdict(const Context&)> run) {
    cases.push_back(Case{op, dtype, std::move(name), code, 0, std::move(run)});
  };
  const Tolerance exact{};

  // reshape
  struct Reshape {
    Dims from, to;
    bool transpose_first;
  };
  for (const Reshape& r : std::vector<Reshape>{{{2, 3, 4}, {6, 4}, false},
                                               {{2, 3, 4}, {-1}, false},
                                               {{2, 3, 4}, {4, -1, 2}, false},
                                               {{}, {1}, false},
                                               {{1}, {}, false},
                                               {{0, 3}, {3, 0}, false},
                                               {{0, 3}, {-1}, false},
                                               {{3, 4}, {12}, true},
                                               {{3, 4}, {2, -1}, true}}) {
    const Operand in =
        r.transpose_first ? transposed(values(rng, dtype, r.from), 0, 1) : plain(values(rng, dtype, r.from));
    const Dims to = r.to;
    add("reshape", BP_OP_COPY,
        (r.transpose_first ? "non-contiguous " : "") + in.describe() + " -> " + dims_text(to),
        [in, to, exact](const Context& ctx) {
          return check(ctx, backplane::reshape(in.on(ctx.device), to), ref::reshape(in.logical(), to), exact);
        });
  }
  const HostTensor m23 = values(rng, dtype, {2, 3});
  add("reshape", BP_OP_COPY, "error: [2, 3] -> [4]", [m23](const Context& ctx) {
    return expect_error([&] { (void)backplane::reshape(upload(ctx.device, m23), {4}); },
                        {Errc::invalid_argument});
  });
  add("reshape", BP_OP_COPY, "error: [2, 3] -> [-1, -1]", [m23](const Context& ctx) {
    return expect_error(
        [&] {
          (void)backplane::reshape(upload(ctx.device, m23), {-1, -1});
        },
        {Errc::invalid_argument});
  });

  // permute
  struct Permute {
    Dims shape, dims;
  };
  for (const Permute& p : std::vector<Permute>{{{2, 3, 4}, {2, 0, 1}},
                                               {{2, 3, 4}, {1, 0, 2}},
                                               {{2, 3, 4}, {-1, 0, 1}},
                                               {{2, 3, 4}, {0, 1, 2}},
                                               {{}, {}},
                                               {{2, 0, 3}, {1, 2, 0}},
                                               {{1, 5, 1}, {2, 1, 0}}}) {
    const Operand in = plain(values(rng, dtype, p.shape));
    const Dims dims = p.dims;
    add("permute", BP_OP_COPY, in.describe() + " dims " + dims_text(dims),
        [in, dims, exact](const Context& ctx) {
          return check(ctx, backplane::permute(in.on(ctx.device), dims), ref::permute(in.logical(), dims),
                       exact);
        });
  }
  {
    const Operand in = permuted(values(rng, dtype, {2, 3, 4}), {2, 0, 1});
    add("permute", BP_OP_COPY, "of a permuted view " + in.describe() + " dims [2, 0, 1]",
        [in, exact](const Context& ctx) {
          return check(ctx, backplane::permute(in.on(ctx.device), {2, 0, 1}),
                       ref::permute(in.logical(), {2, 0, 1}), exact);
        });
    const HostTensor t = values(rng, dtype, {2, 3, 4});
    add("permute", BP_OP_COPY, "error: dims [0, 0, 1]", [t](const Context& ctx) {
      return expect_error(
          [&] {
            (void)backplane::permute(upload(ctx.device, t), {0, 0, 1});
          },
          {Errc::invalid_argument});
    });
    add("permute", BP_OP_COPY, "error: dims [1, 0] of rank 3", [t](const Context& ctx) {
      return expect_error(
          [&] {
            (void)backplane::permute(upload(ctx.device, t), {1, 0});
          },
          {Errc::invalid_argument});
    });
  }

  // transpose
  struct Transpose {
    Dims shape;
    int64_t d0, d1;
  };
  for (const Transpose& tr : std::vector<Transpose>{{{3, 4}, 0, 1},
                                                    {{2, 3, 4}, 0, 2},
                                                    {{2, 3, 4}, -1, -2},
                                                    {{2, 3, 4}, 1, 1},
                                                    {{0, 4}, 0, 1},
                                                    {{300, 257}, 0, 1}}) {
    const Operand in = plain(values(rng, dtype, tr.shape));
    const int64_t d0 = tr.d0, d1 = tr.d1;
    add("transpose", BP_OP_COPY, in.describe() + " (" + std::to_string(d0) + ", " + std::to_string(d1) + ")",
        [in, d0, d1, exact](const Context& ctx) {
          return check(ctx, backplane::transpose(in.on(ctx.device), d0, d1),
                       ref::transpose(in.logical(), d0, d1), exact);
        });
  }
  {
    const Operand in = transposed(values(rng, dtype, {3, 4}), 0, 1);
    add("transpose", BP_OP_COPY, "twice " + in.describe() + " (0, 1)", [in, exact](const Context& ctx) {
      return check(ctx, backplane::transpose(in.on(ctx.device), 0, 1), ref::transpose(in.logical(), 0, 1),
                   exact);
    });
  }

  // slice
  struct Slice {
    Dims shape;
    int64_t axis, start, end, step;
  };
  for (const Slice& s : std::vector<Slice>{{{10}, 0, 2, 8, 1},
                                           {{10}, 0, 0, 10, 3},
                                           {{10}, 0, -3, 100, 1},
                                           {{10}, 0, -100, 4, 1},
                                           {{10}, 0, 5, 2, 1},
                                           {{10}, 0, 10, 12, 1},
                                           {{4, 6}, 1, 1, 5, 2},
                                           {{4, 6}, -1, 0, 6, 4},
                                           {{4, 6}, 0, 3, 4, 1},
                                           {{0, 6}, 1, 1, 3, 1}}) {
    const Operand in = plain(values(rng, dtype, s.shape));
    const Slice sl = s;
    add("slice", BP_OP_COPY,
        in.describe() + " axis " + std::to_string(s.axis) + " [" + std::to_string(s.start) + ":" +
            std::to_string(s.end) + ":" + std::to_string(s.step) + "]",
        [in, sl, exact](const Context& ctx) {
          return check(ctx, backplane::slice(in.on(ctx.device), sl.axis, sl.start, sl.end, sl.step),
                       ref::slice(in.logical(), sl.axis, sl.start, sl.end, sl.step), exact);
        });
  }
  {
    const Operand s1 = sliced(values(rng, dtype, {5, 12}), 1, 1, 12, 2);  // [5, 6]
    add("slice", BP_OP_COPY, "of a slice " + s1.describe() + " axis 0 [1:5:2]",
        [s1, exact](const Context& ctx) {
          return check(ctx, backplane::slice(s1.on(ctx.device), 0, 1, 5, 2),
                       ref::slice(s1.logical(), 0, 1, 5, 2), exact);
        });
    const Operand t1 = transposed(values(rng, dtype, {5, 7}), 0, 1);  // [7, 5]
    add("slice", BP_OP_COPY, "of a transposed view " + t1.describe() + " axis 1 [1:4]",
        [t1, exact](const Context& ctx) {
          return check(ctx, backplane::slice(t1.on(ctx.device), 1, 1, 4, 1),
                       ref::slice(t1.logical(), 1, 1, 4, 1), exact);
        });
    const HostTensor t = values(rng, dtype, {4, 6});
    add("slice", BP_OP_COPY, "error: step 0", [t](const Context& ctx) {
      return expect_error([&] { (void)backplane::slice(upload(ctx.device, t), 1, 0, 4, 0); },
                          {Errc::invalid_argument});
    });
    add("slice", BP_OP_COPY, "error: negative step", [t](const Context& ctx) {
      return expect_error([&] { (void)backplane::slice(upload(ctx.device, t), 1, 4, 0, -1); },
                          {Errc::invalid_argument});
    });
    add("slice", BP_OP_COPY, "error: axis 2 of [4, 6]", [t](const Context& ctx) {
      return expect_error([&] { (void)backplane::slice(upload(ctx.device, t), 2, 0, 1, 1); },
                          {Errc::invalid_argument});
    });
  }

  // cat
  struct Cat {
    const char* tag;
    std::vector<Dims> shapes;
    int64_t axis;
  };
  for (const Cat& c : std::vector<Cat>{{"", {{2, 3}, {4, 3}}, 0},
                                       {"", {{2, 3}, {2, 1}, {2, 5}}, 1},
                                       {"", {{2, 3}, {2, 2}}, -1},
                                       {"with an empty ", {{2, 3}, {0, 3}, {1, 3}}, 0},
                                       {"all empty ", {{0, 3}, {0, 3}}, 0},
                                       {"one tensor ", {{3, 2}}, 0},
                                       {"1-D ", {{5}, {1}, {3}}, 0},
                                       {"3-D ", {{2, 3, 4}, {2, 1, 4}}, 1}}) {
    std::vector<Operand> parts;
    std::string name = c.tag;
    for (const Dims& s : c.shapes) {
      parts.push_back(plain(values(rng, dtype, s)));
      name += (parts.size() > 1 ? " + " : "") + shape_text(s);
    }
    const int64_t axis = c.axis;
    name += " axis " + std::to_string(axis);
    add("cat", BP_OP_COPY, name, [parts, axis, exact](const Context& ctx) {
      std::vector<Tensor> on;
      std::vector<HostTensor> host;
      for (const Operand& p : parts) {
        on.push_back(p.on(ctx.device));
        host.push_back(p.logical());
      }
      return check(ctx, backplane::cat(on, axis), ref::cat(host, axis), exact);
    });
  }
  {
    const std::vector<Operand> parts = {transposed(values(rng, dtype, {3, 2}), 0, 1),
                                        plain(values(rng, dtype, {2, 4})),
                                        sliced(values(rng, dtype, {2, 9}), 1, 0, 9, 3)};
    add("cat", BP_OP_COPY,
        "strided inputs " + parts[0].describe() + " + [2, 4] + " + parts[2].describe() + " axis 1",
        [parts, exact](const Context& ctx) {
          std::vector<Tensor> on;
          std::vector<HostTensor> host;
          for (const Operand& p : parts) {
            on.push_back(p.on(ctx.device));
            host.push_back(p.logical());
          }
          return check(ctx, backplane::cat(on, 1), ref::cat(host, 1), exact);
        });
    const HostTensor a = values(rng, dtype, {2, 3}), b = values(rng, dtype, {2, 4});
    add("cat", BP_OP_COPY, "error: [2, 3] + [2, 4] axis 0", [a, b](const Context& ctx) {
      return expect_error(
          [&] {
            (void)backplane::cat({upload(ctx.device, a), upload(ctx.device, b)}, 0);
          },
          {Errc::shape_mismatch});
    });
    const HostTensor other =
        make_host(dtype == DType::f32 ? DType::f64 : DType::f32, {2, 3}, std::vector<double>(6, 1));
    add("cat", BP_OP_COPY, "error: mixed dtypes", [a, other](const Context& ctx) {
      return expect_error(
          [&] {
            (void)backplane::cat({upload(ctx.device, a), upload(ctx.device, other)}, 0);
          },
          {Errc::dtype_mismatch});
    });
    add("cat", BP_OP_COPY, "error: no tensors", [](const Context&) {
      return expect_error([&] { (void)backplane::cat({}, 0); }, {Errc::invalid_argument});
    });
  }

  // index_select
  struct Select {
    Dims shape;
    int64_t axis;
    std::vector<int64_t> index;
  };
  for (const Select& s : std::vector<Select>{{{5, 3}, 0, {4, 0, 0, 2}},
                                             {{5, 3}, 1, {2, 1}},
                                             {{5, 3}, -1, {0, 0, 0, 2, 1}},
                                             {{5, 3}, 0, {}},
                                             {{2, 4, 3}, 1, {3, 1}},
                                             {{6}, 0, {5, 4, 3, 2, 1, 0}}}) {
    const Operand in = plain(values(rng, dtype, s.shape));
    const Select sel = s;
    add("index_select", BP_OP_INDEX_SELECT,
        in.describe() + " axis " + std::to_string(s.axis) + " index " + dims_text(s.index),
        [in, sel, exact](const Context& ctx) {
          const Tensor index =
              upload(ctx.device, indices({static_cast<int64_t>(sel.index.size())}, sel.index));
          return check(ctx, backplane::index_select(in.on(ctx.device), sel.axis, index),
                       ref::index_select(in.logical(), sel.axis, sel.index), exact);
        });
  }
  {
    const Operand in = transposed(values(rng, dtype, {3, 5}), 0, 1);  // [5, 3]
    add("index_select", BP_OP_INDEX_SELECT, "strided " + in.describe() + " axis 0 index [4, 1]",
        [in, exact](const Context& ctx) {
          const Tensor index = upload(ctx.device, indices({2}, {4, 1}));
          return check(ctx, backplane::index_select(in.on(ctx.device), 0, index),
                       ref::index_select(in.logical(), 0, {4, 1}), exact);
        });
    const HostTensor t = values(rng, dtype, {5, 3});
    add("index_select", BP_OP_INDEX_SELECT, "error: index 5 of extent 5", [t](const Context& ctx) {
      return expect_error(
          [&] {
            (void)download(
                backplane::index_select(upload(ctx.device, t), 0, upload(ctx.device, indices({2}, {1, 5}))));
          },
          {Errc::invalid_argument});
    });
    add("index_select", BP_OP_INDEX_SELECT, "error: index -1", [t](const Context& ctx) {
      return expect_error(
          [&] {
            (void)download(
                backplane::index_select(upload(ctx.device, t), 0, upload(ctx.device, indices({2}, {1, -1}))));
          },
          {Errc::invalid_argument});
    });
    add("index_select", BP_OP_INDEX_SELECT, "error: i32 index", [t](const Context& ctx) {
      return expect_error(
          [&] {
            const Tensor index = upload(ctx.device, make_host_int(DType::i32, {1}, {0}));
            (void)backplane::index_select(upload(ctx.device, t), 0, index);
          },
          {Errc::dtype_mismatch, Errc::invalid_argument});
    });
  }

  // gather
  struct Gather {
    Dims shape;
    int64_t axis;
    Dims index_shape;
  };
  for (const Gather& g : std::vector<Gather>{{{3, 4}, 1, {3, 2}},
                                             {{3, 4}, 0, {2, 4}},
                                             {{3, 4}, -1, {2, 6}},
                                             {{2, 3, 4}, 2, {2, 3, 5}},
                                             {{2, 3, 4}, 1, {1, 2, 2}},
                                             {{3, 4}, 1, {3, 0}}}) {
    const Operand in = plain(values(rng, dtype, g.shape));
    const int64_t axis = g.axis;
    const int64_t extent =
        g.shape[static_cast<std::size_t>(axis < 0 ? axis + static_cast<int64_t>(g.shape.size()) : axis)];
    HostTensor index = random_host(rng, DType::i64, g.index_shape, 0, static_cast<double>(extent - 1));
    add("gather", BP_OP_GATHER,
        in.describe() + " axis " + std::to_string(axis) + " index " + shape_text(g.index_shape),
        [in, axis, index, exact](const Context& ctx) {
          return check(ctx, backplane::gather(in.on(ctx.device), axis, upload(ctx.device, index)),
                       ref::gather(in.logical(), axis, index), exact);
        });
  }
  {
    const Operand in = transposed(values(rng, dtype, {4, 3}), 0, 1);  // [3, 4]
    const HostTensor index = random_host(rng, DType::i64, {3, 2}, 0, 3);
    add("gather", BP_OP_GATHER, "strided " + in.describe() + " axis 1 index [3, 2]",
        [in, index, exact](const Context& ctx) {
          return check(ctx, backplane::gather(in.on(ctx.device), 1, upload(ctx.device, index)),
                       ref::gather(in.logical(), 1, index), exact);
        });
    const HostTensor t = values(rng, dtype, {3, 4});
    add("gather", BP_OP_GATHER, "error: index 4 of extent 4", [t](const Context& ctx) {
      return expect_error(
          [&] {
            (void)download(
                backplane::gather(upload(ctx.device, t), 1, upload(ctx.device, indices({3, 1}, {0, 4, 1}))));
          },
          {Errc::invalid_argument});
    });
    add("gather", BP_OP_GATHER, "error: index of another rank", [t](const Context& ctx) {
      return expect_error(
          [&] {
            (void)backplane::gather(upload(ctx.device, t), 1, upload(ctx.device, indices({3}, {0, 1, 2})));
          },
          {Errc::invalid_argument, Errc::shape_mismatch});
    });
  }

  // contiguous
  for (const Operand& in :
       {transposed(values(rng, dtype, {4, 6}), 0, 1), sliced(values(rng, dtype, {4, 9}), 1, 1, 9, 3),
        plain(values(rng, dtype, {3, 5})), plain(values(rng, dtype, {}))}) {
    add("contiguous", BP_OP_COPY, in.describe(), [in, exact](const Context& ctx) {
      const Tensor got = backplane::contiguous(in.on(ctx.device));
      if (!got.is_contiguous())
        return Verdict::fail("the result is not contiguous (strides " + got.strides().to_string() + ")");
      return check(ctx, got, in.logical(), exact);
    });
  }

  // to
  {
    const Operand in = plain(values(rng, dtype, {3, 4}));
    add("to", BP_OP_COPY, "same device", [in, exact](const Context& ctx) {
      const Tensor t = in.on(ctx.device);
      return check(ctx, backplane::to(t, ctx.device), in.logical(), exact);
    });
    const Operand view = transposed(values(rng, dtype, {4, 3}), 0, 1);
    for (const Operand& src : {in, view}) {
      add("to", BP_OP_COPY, "to the peer device and back " + src.describe(),
          [src, exact](const Context& ctx) {
            if (!ctx.peer.valid() || ctx.peer == ctx.device)
              return Verdict::skip("no peer device (Options::peer)");
            // The peer's limits are not the device's: a dtype it cannot hold is a skip.
            const Capability holds = capability_for(src.base.dtype);
            if (!ctx.peer.capabilities().has(holds))
              return Verdict::skip("the peer device " + ctx.peer.id() + " cannot hold " +
                                   std::string(to_string(src.base.dtype)) + " (no '" +
                                   std::string(to_string(holds)) + "' capability)");
            const Tensor there = backplane::to(src.on(ctx.device), ctx.peer);
            if (!(there.device() == ctx.peer))
              return Verdict::fail("to(peer) gave a tensor on " + there.device().id());
            const HostTensor on_peer = download(there);
            const HostTensor want = src.logical();
            if (on_peer.shape != want.shape || on_peer.f != want.f || on_peer.i != want.i) {
              return Verdict::fail("the values on " + ctx.peer.id() + " differ from the source");
            }
            return check(ctx, there.to(ctx.device), want, exact);
          });
    }
  }
}

void add_cast_cases(Cases& cases) {
  for (const DType from : kAll) {
    for (const DType to : kAll) {
      std::vector<std::pair<std::string, HostTensor>> inputs;
      const std::string pair = std::string(to_string(from)) + " -> " + std::string(to_string(to));
      if (is_float(from)) {
        std::vector<double> v = {0.0, -0.0,   1.0,    -1.0, 2.75,       -2.75,
                                 0.5, -0.999, 100.25, -1e6, 16777217.0, 0.1};
        if (is_float(to) || to == DType::bool_) {  // NaN/Inf to an integer is unspecified
          v.insert(v.end(), {kNaN, kInf, -kInf});
          if (from == DType::f64 && to == DType::f32) v.insert(v.end(), {1e300, -1e300, 1e-50});
        }
        inputs.emplace_back(pair, make_host(from, {static_cast<int64_t>(v.size())}, v));
      } else if (from == DType::bool_) {
        inputs.emplace_back(pair, make_host(from, {4}, {1, 0, 0, 1}));
      } else {
        std::vector<int64_t> v = {0, 1, -1, 7, -7, 1000, -123456, 16777217, 2147483647, -2147483647 - 1};
        if (from == DType::i64) {
          v.insert(v.end(), {int64_t{1} << 40, (int64_t{1} << 40) + 1, (int64_t{1} << 32) + 5,
                             int64_t{1} << 31, -(int64_t{1} << 35) - 3});
        }
        inputs.emplace_back(pair, make_host_int(from, {static_cast<int64_t>(v.size())}, v));
      }
      Rng rng(seed_of("cast" + pair));
      inputs.emplace_back(pair + " empty [0, 2]", make_host(from, {0, 2}, {}));
      inputs.emplace_back(pair + " scalar", values(rng, from, {}));
      for (const auto& [name, host] : inputs) {
        const Operand in = plain(host);
        cases.push_back(Case{"cast", from, name, BP_OP_INVALID, 0, [in, to](const Context& ctx) {
                               return check(ctx, backplane::cast(in.on(ctx.device), to),
                                            ref::cast(in.logical(), to), Tolerance{});
                             }});
      }
      const Operand strided = transposed(values(rng, from, {3, 5}), 0, 1);
      cases.push_back(Case{"cast", from, pair + " strided " + strided.describe(), BP_OP_INVALID, 0,
                           [strided, to](const Context& ctx) {
                             return check(ctx, backplane::cast(strided.on(ctx.device), to),
                                          ref::cast(strided.logical(), to), Tolerance{});
                           }});
    }
  }
}

}  // namespace

void add_shape_cases(Cases& cases) {
  for (const DType dtype : kAll) add_shape_op_cases(cases, dtype);
  add_cast_cases(cases);
}

}  // namespace backplane::conformance
