// Writes the fuzzer's seed corpus (tests/fuzz/corpus/remote_server): streams of
// valid frames covering every request type, every op family, collectives on
// a one-rank communicator and well-formed requests the server must refuse.
// Usage: remote_server_fuzz_corpus OUTPUT_DIR
#include "raw_client.hpp"

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

namespace {

using namespace rstest;
using Stream = std::vector<uint8_t>;

void add(Stream& s, const std::vector<uint8_t>& frame) { s.insert(s.end(), frame.begin(), frame.end()); }

template <class T>
void write(Stream& s, uint64_t id, uint64_t buffer, const std::vector<T>& values) {
  add(s, msg::write(id, buffer, 0, values.size() * sizeof(T)));
  const auto b = bytes_of(values);
  s.insert(s.end(), b.begin(), b.end());
}

std::vector<uint8_t> comm_create(uint64_t id, uint64_t comm, int32_t world) {
  flatbuffers::FlatBufferBuilder b;
  return frame_of(b, id, wire::CreateCommCreate(b, comm, 0, 0, world, 1000, b.CreateString("seed/")));
}

std::vector<uint8_t> collective(uint64_t id, uint64_t comm, wire::CollectiveKind kind, const msg::Desc* in,
                                const msg::Desc* out, int32_t reduce_op = BP_REDUCE_SUM) {
  flatbuffers::FlatBufferBuilder b;
  const auto i = in != nullptr ? msg::tensor(b, *in) : flatbuffers::Offset<wire::TensorDesc>();
  const auto o = out != nullptr ? msg::tensor(b, *out) : flatbuffers::Offset<wire::TensorDesc>();
  return frame_of(b, id, wire::CreateCollective(b, comm, kind, i, o, reduce_op, 0));
}

template <class Body>
std::vector<uint8_t> simple(uint64_t id, Body make) {
  flatbuffers::FlatBufferBuilder b;
  return frame_of(b, id, make(b));
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s OUTPUT_DIR\n", argv[0]);
    return 64;
  }
  const std::filesystem::path dir = argv[1];
  std::filesystem::create_directories(dir);
  std::vector<std::pair<std::string, Stream>> seeds;
  auto seed = [&](const std::string& name) -> Stream& { return seeds.emplace_back(name, Stream{}).second; };
  const auto f32 = [](uint64_t buffer, std::vector<int64_t> shape) { return msg::contiguous(buffer, shape); };

  {  // the round trip a client makes
    Stream& s = seed("add_read");
    for (uint64_t b = 1; b <= 3; ++b) add(s, msg::alloc(b, b, 0, 16));
    write(s, 4, 1, std::vector<float>{1, 2, 3, 4});
    write(s, 5, 2, std::vector<float>{5, 6, 7, 8});
    add(s, msg::execute(6, BP_OP_ADD, {f32(1, {4}), f32(2, {4})}, {f32(3, {4})}));
    add(s, msg::read(7, 3, 0, 16));
    add(s, msg::synchronize(8));
    for (uint64_t b = 1; b <= 3; ++b) add(s, msg::free(8 + b, b));
    add(s, msg::goodbye(12));
  }
  {  // broadcasting (stride 0), comparisons and where
    Stream& s = seed("broadcast_where");
    add(s, msg::alloc(1, 1, 0, 24));
    add(s, msg::alloc(2, 2, 0, 8));
    add(s, msg::alloc(3, 3, 0, 6));
    add(s, msg::alloc(4, 4, 0, 24));
    add(s, msg::execute(5, BP_OP_LT, {f32(1, {2, 3}), msg::Desc{2, 0, BP_DTYPE_F32, {2, 3}, {1, 0}}},
                        {msg::contiguous(3, {2, 3}, BP_DTYPE_BOOL)}));
    add(s, msg::execute(6, BP_OP_WHERE,
                        {msg::contiguous(3, {2, 3}, BP_DTYPE_BOOL), f32(1, {2, 3}), f32(4, {2, 3})},
                        {f32(4, {2, 3})}));
    add(s, msg::execute(7, BP_OP_WHERE,
                        {msg::contiguous(3, {2, 3}, BP_DTYPE_BOOL), f32(1, {2, 3}), f32(1, {2, 3})},
                        {f32(4, {2, 3})}));
    add(s, msg::synchronize(8));
  }
  {  // matmul, with and without a batch dimension
    Stream& s = seed("matmul");
    add(s, msg::alloc(1, 1, 0, 48));
    add(s, msg::alloc(2, 2, 0, 48));
    add(s, msg::alloc(3, 3, 0, 32));
    add(s, msg::execute(4, BP_OP_MATMUL, {f32(1, {2, 3}), f32(2, {3, 2})}, {f32(3, {2, 2})}));
    add(s, msg::execute(5, BP_OP_MATMUL,
                        {f32(1, {2, 2, 3}), msg::Desc{2, 0, BP_DTYPE_F32, {2, 3, 1}, {0, 1, 1}}},
                        {f32(3, {2, 2, 1})}));
    add(s, msg::read(6, 3, 0, 16));
  }
  {  // reductions, arg reductions, softmax
    Stream& s = seed("reduce");
    add(s, msg::alloc(1, 1, 0, 24));
    add(s, msg::alloc(2, 2, 0, 12));
    add(s, msg::alloc(3, 3, 0, 16));
    add(s, msg::execute(4, BP_OP_SUM, {f32(1, {2, 3})}, {f32(2, {2, 1})}, 0, 1));
    add(s, msg::execute(5, BP_OP_MEAN, {f32(1, {2, 3})}, {f32(2, {1, 3})}, 0, 0));
    add(s, msg::execute(6, BP_OP_ARGMAX, {f32(1, {2, 3})}, {msg::contiguous(3, {2, 1}, BP_DTYPE_I64)}, 0, 1));
    add(s, msg::execute(7, BP_OP_SOFTMAX, {f32(1, {2, 3})}, {msg::contiguous(1, {2, 3})}, 0, 1));
    add(s, msg::execute(8, BP_OP_LOG_SOFTMAX, {f32(1, {6})}, {f32(3, {4})}, 0, 0));
    add(s, msg::synchronize(9));
  }
  {  // cast, unary ops, clamp, strided copy (a transposed view)
    Stream& s = seed("unary_cast_copy");
    add(s, msg::alloc(1, 1, 0, 24));
    add(s, msg::alloc(2, 2, 0, 24));
    add(s, msg::execute(3, BP_OP_CAST, {f32(1, {6})}, {msg::contiguous(2, {6}, BP_DTYPE_I32)}, 0, 0,
                        BP_DTYPE_I32));
    for (int32_t op : {BP_OP_NEG, BP_OP_EXP, BP_OP_SQRT, BP_OP_RELU, BP_OP_CLAMP})
      add(s, msg::execute(10 + static_cast<uint64_t>(op), op, {f32(1, {6})}, {f32(2, {6})}));
    add(s, msg::execute(50, BP_OP_COPY, {f32(1, {2, 3})}, {msg::Desc{2, 0, BP_DTYPE_F32, {2, 3}, {1, 2}}}));
    add(s, msg::read(51, 2, 4, 8));
  }
  {  // creation ops and index ops
    Stream& s = seed("create_index");
    add(s, msg::alloc(1, 1, 0, 32));
    add(s, msg::alloc(2, 2, 0, 16));
    add(s, msg::alloc(3, 3, 0, 16));
    add(s, msg::execute(4, BP_OP_FILL, {}, {f32(1, {8})}));
    add(s, msg::execute(5, BP_OP_ARANGE, {}, {f32(1, {8})}));
    add(s, msg::execute(6, BP_OP_RAND_UNIFORM, {}, {f32(1, {2, 4})}));
    add(s, msg::execute(7, BP_OP_FILL, {}, {msg::contiguous(2, {2}, BP_DTYPE_I64)}));
    add(s, msg::execute(8, BP_OP_INDEX_SELECT, {f32(1, {2, 4}), msg::contiguous(2, {2}, BP_DTYPE_I64)},
                        {f32(3, {2, 2})}, 0, 1));
    add(s, msg::execute(9, BP_OP_GATHER, {f32(1, {2, 4}), msg::contiguous(2, {2, 1}, BP_DTYPE_I64)},
                        {f32(3, {2, 1})}, 0, 1));
    add(s, msg::synchronize(10));
  }
  {  // every collective on a one-rank communicator, then abort and destroy
    Stream& s = seed("collectives");
    add(s, msg::alloc(1, 1, 0, 16));
    add(s, msg::alloc(2, 2, 0, 16));
    add(s, comm_create(3, 7, 1));
    const msg::Desc a = f32(1, {4}), b = f32(2, {4});
    add(s, collective(4, 7, wire::CollectiveKind::AllReduce, &a, &a));
    add(s, collective(5, 7, wire::CollectiveKind::AllReduce, &a, &b, BP_REDUCE_MAX));
    add(s, collective(6, 7, wire::CollectiveKind::Broadcast, nullptr, &a));
    add(s, collective(7, 7, wire::CollectiveKind::AllGather, &a, &b));
    add(s, collective(8, 7, wire::CollectiveKind::ReduceScatter, &a, &b));
    add(s, collective(9, 7, wire::CollectiveKind::Barrier, nullptr, nullptr));
    add(s, simple(10, [](auto& fb) { return wire::CreateCommAbort(fb, 7); }));
    add(s, simple(11, [](auto& fb) { return wire::CreateCommDestroy(fb, 7); }));
    add(s, comm_create(12, 8, 2));  // two ranks: the store is asked, and fails
  }
  {  // the other synchronising and control messages
    Stream& s = seed("control");
    add(s, simple(1, [](auto& fb) { return wire::CreateMemoryQuery(fb, 0); }));
    add(s, msg::ping(2));
    add(s, simple(3, [](auto& fb) { return wire::CreateKvReply(fb, 0, fb.CreateString("")); }));
    add(s, msg::synchronize(4));
    add(s, msg::goodbye(5));
  }
  {  // well-formed requests the server must refuse
    Stream& s = seed("refused");
    add(s, msg::alloc(1, 1, 0, 16));
    add(s, msg::alloc(2, 1, 0, 16));  // duplicate id
    add(s, msg::alloc(3, 0, 0, 16));  // id 0
    add(s, msg::alloc(4, 2, 3, 16));  // no device 3
    add(s, msg::alloc(5, 3, 0, uint64_t{1} << 40));
    write(s, 6, 9, std::vector<float>{1});  // not allocated
    add(s, msg::read(7, 1, 12, 8));         // past the end
    add(s, msg::execute(8, BP_OP_ADD, {msg::Desc{1, 4, BP_DTYPE_F32, {4}, {1}}, f32(1, {4})}, {f32(1, {4})}));
    add(s, msg::execute(9, 777, {f32(1, {4})}, {f32(1, {4})}));
    add(s, msg::execute(10, BP_OP_NEG, {msg::Desc{1, 0, 42, {4}, {1}}}, {f32(1, {4})}));
    add(s, msg::free(11, 1));
    add(s, msg::free(12, 1));
    add(s, msg::synchronize(13));
  }
  for (const auto& [name, bytes] : seeds) {
    std::ofstream out(dir / name, std::ios::binary);
    out.write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
  }
  std::printf("wrote %zu seeds to %s\n", seeds.size(), dir.c_str());
  return 0;
}
