// What the multi-process test workers share: this rank for messages, the
// failure line the ctest FAIL_REGULAR_EXPRESSION looks for, and flag parsing.
#ifndef BACKPLANE_TESTS_INTEGRATION_WORKER_SUPPORT_HPP_
#define BACKPLANE_TESTS_INTEGRATION_WORKER_SUPPORT_HPP_

#include <cstdlib>
#include <iostream>
#include <string>

namespace worker {

inline int g_rank = -1;

[[noreturn]] inline void fail(const std::string& what) {
  std::cout << "rank " << g_rank << ": FAIL " << what << std::endl;
  std::exit(1);
}

// The value after `name` on the command line, or `fallback`.
inline std::string arg(int argc, char** argv, const std::string& name, const std::string& fallback = "") {
  for (int i = 1; i + 1 < argc; ++i)
    if (argv[i] == name) return argv[i + 1];
  return fallback;
}

inline bool has_flag(int argc, char** argv, const std::string& name) {
  for (int i = 1; i < argc; ++i)
    if (argv[i] == name) return true;
  return false;
}

}  // namespace worker

#endif  // BACKPLANE_TESTS_INTEGRATION_WORKER_SUPPORT_HPP_
