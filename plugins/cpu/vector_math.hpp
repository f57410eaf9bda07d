// Lets GCC vectorise loops that call exp, log, sin, cos, tanh and pow: declares the
// vector variants glibc's libmvec provides. glibc's <math.h> declares them only under
// -ffast-math, which the kernels must not use (NaN and Inf have to propagate).
// Effective together with -fno-math-errno (a libm call that may set errno cannot be
// vectorised). BACKPLANE_CPU_HAVE_MVEC, set by the build where libmvec is found and
// linked, turns it on; without it the loops stay scalar and give the same results
// within libm's accuracy (libmvec: at most 4 ulp, special values as libm).
#ifndef BACKPLANE_PLUGINS_CPU_VECTOR_MATH_HPP_
#define BACKPLANE_PLUGINS_CPU_VECTOR_MATH_HPP_

#include <math.h>

#if defined(BACKPLANE_CPU_HAVE_MVEC) && defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) && \
    defined(__GLIBC__) && !defined(__FAST_MATH__)
#define BP_CPU_VECTOR_MATH 1
// "notinbranch": called unconditionally in the loop body; GCC then calls
// _ZGV{b,c,d,e}N<lanes>v_<name> for the SSE, AVX, AVX2 or AVX-512 code it emits.
#define BP_CPU_SIMD_DECL __attribute__((simd("notinbranch")))
extern "C" {
BP_CPU_SIMD_DECL float expf(float) noexcept;
BP_CPU_SIMD_DECL double exp(double) noexcept;
BP_CPU_SIMD_DECL float logf(float) noexcept;
BP_CPU_SIMD_DECL double log(double) noexcept;
BP_CPU_SIMD_DECL float sinf(float) noexcept;
BP_CPU_SIMD_DECL double sin(double) noexcept;
BP_CPU_SIMD_DECL float cosf(float) noexcept;
BP_CPU_SIMD_DECL double cos(double) noexcept;
BP_CPU_SIMD_DECL float powf(float, float) noexcept;
BP_CPU_SIMD_DECL double pow(double, double) noexcept;
#if __GLIBC_PREREQ(2, 35)  // libmvec's tanh came with glibc 2.35
BP_CPU_SIMD_DECL float tanhf(float) noexcept;
BP_CPU_SIMD_DECL double tanh(double) noexcept;
#endif
}
#undef BP_CPU_SIMD_DECL
#else
#define BP_CPU_VECTOR_MATH 0
#endif

#endif  // BACKPLANE_PLUGINS_CPU_VECTOR_MATH_HPP_
