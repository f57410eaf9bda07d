// Subnormal floats flushed to zero: the cpu option "flush_denormals". A
// subnormal operand or result (below 1.2e-38 in f32) costs x86 cores a
// microcode assist of about a hundred cycles per instruction; SGD's momentum
// of a weight whose gradient is zero decays through that range, and the
// update that reads it slows down many times (docs/cpu.md). MXCSR's FTZ
// (results) and DAZ (operands) bits make such values zero instead, as
// TensorFlow and XLA do by default and torch.set_flush_denormal(True) asks.
//
// The mode is a thread's: the plugin switches it on the calling thread for
// one op and puts the two bits back after (exception flags the op raised
// stay raised, as they would without the option), and each OpenMP team
// thread runs its chunk in the mode of the thread that started the team.
// A thread created while a thread flushes inherits its mode (Linux threads
// start with their creator's MXCSR): libgomp's workers, when a flushed op
// opens the process's first team, keep flushing outside these ops.
#ifndef BACKPLANE_PLUGINS_CPU_FP_MODE_HPP_
#define BACKPLANE_PLUGINS_CPU_FP_MODE_HPP_

#if defined(__x86_64__)
#include <xmmintrin.h>
#endif

namespace backplane::cpu {

#if defined(__x86_64__)
// Whether this build can flush subnormals (the option is refused where not).
inline constexpr bool kCanFlushDenormals = true;
// MXCSR's flush-to-zero (bit 15) and denormals-are-zero (bit 6).
inline constexpr unsigned kFlushDenormalBits = 0x8040u;
// The calling thread's flush bits.
inline unsigned fp_mode() noexcept { return _mm_getcsr() & kFlushDenormalBits; }
#else
inline constexpr bool kCanFlushDenormals = false;
inline constexpr unsigned kFlushDenormalBits = 0u;
inline unsigned fp_mode() noexcept { return 0u; }
#endif

// Sets the calling thread's flush bits to `mode` for the scope's life, when
// they differ: one register read otherwise.
class FpModeScope {
 public:
  explicit FpModeScope(unsigned mode) noexcept : saved_(fp_mode()), mode_(mode) {
    if (saved_ != mode_) set(mode_);
  }
  ~FpModeScope() {
    if (saved_ != mode_) set(saved_);
  }
  FpModeScope(const FpModeScope&) = delete;
  FpModeScope& operator=(const FpModeScope&) = delete;

 private:
  static void set([[maybe_unused]] unsigned bits) noexcept {
#if defined(__x86_64__)
    _mm_setcsr((_mm_getcsr() & ~kFlushDenormalBits) | bits);
#endif
  }
  unsigned saved_;
  unsigned mode_;
};

}  // namespace backplane::cpu

#endif  // BACKPLANE_PLUGINS_CPU_FP_MODE_HPP_
