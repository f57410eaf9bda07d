// The helpers the session's files share (session.cpp, session_buffers.cpp,
// session_ops.cpp, session_comms.cpp): refusing a request, and the names of
// ops, dtypes and collectives that its failure text uses. Internal to
// remote/server.
#ifndef BACKPLANE_REMOTE_SERVER_SESSION_INTERNAL_HPP_
#define BACKPLANE_REMOTE_SERVER_SESSION_INTERNAL_HPP_

#include "remote/server/hosted.hpp"
#include "remote/server/validate.hpp"
#include "remote_generated.h"

#include <backplane/abi.h>

#include <cstdint>
#include <string>

namespace backplane::remote::server {

[[noreturn]] inline void refuse(const std::string& message, int32_t code = BP_STATUS_INVALID_ARGUMENT) {
  throw Refused(code, message);
}

inline void check(const PluginStatus& s) {
  if (!s.ok()) throw Refused(s.code(), s.message());
}

inline std::string op_text(int32_t op) {
  const char* name = bp_op_name(op);
  return name != nullptr ? std::string(name) : "op " + std::to_string(op);
}

inline std::string dtype_text(int32_t dtype) {
  const char* name = bp_dtype_name(dtype);
  return name != nullptr ? std::string(name) : "dtype " + std::to_string(dtype);
}

inline std::string collective_text(wire::CollectiveKind kind) {
  switch (kind) {
    case wire::CollectiveKind::AllReduce:
      return "all_reduce";
    case wire::CollectiveKind::Broadcast:
      return "broadcast";
    case wire::CollectiveKind::AllGather:
      return "all_gather";
    case wire::CollectiveKind::ReduceScatter:
      return "reduce_scatter";
    case wire::CollectiveKind::Barrier:
      return "barrier";
  }
  return "collective " + std::to_string(static_cast<int>(kind));
}

}  // namespace backplane::remote::server

#endif  // BACKPLANE_REMOTE_SERVER_SESSION_INTERNAL_HPP_
