// Slurm's compressed host lists ("node[07-09,12],gpu1"), as in
// SLURM_JOB_NODELIST: only what the rendezvous needs, the first host.
#ifndef BACKPLANE_CORE_DISTRIBUTED_SLURM_HOSTLIST_HPP_
#define BACKPLANE_CORE_DISTRIBUTED_SLURM_HOSTLIST_HPP_

#include <string>

namespace backplane::slurm {

// The first host of `hostlist`, the value of the environment variable
// `variable`: its first comma-separated entry with each bracket replaced by
// the first number in it, as written (zero padding kept):
//   "node[07-09,12],gpu1" -> "node07", "a,b" -> "a",
//   "rack[2-3]-n[001-004]" -> "rack2-n001".
// The whole list is checked; an empty one, an empty entry, unbalanced or
// nested brackets, a range that is not N or N-M with N <= M, or a character
// that no host name has is Errc::invalid_argument naming the variable, its
// value and what is wrong.
std::string first_host(const char* variable, const std::string& hostlist);

}  // namespace backplane::slurm

#endif  // BACKPLANE_CORE_DISTRIBUTED_SLURM_HOSTLIST_HPP_
