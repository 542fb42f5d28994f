#pragma once
// Portability macros shared by every header.
//
// SKEWADAM_HD marks functions that are usable from host code and, when the
// header is compiled by nvcc, from CUDA device code. Per-element math is
// written once with it, so the CPU and GPU backends cannot drift apart.

#include <cstdint>

#if defined(__CUDACC__) || defined(__HIPCC__)
#define SKEWADAM_HD __host__ __device__
#else
#define SKEWADAM_HD
#endif

#if defined(__GNUC__) || defined(__clang__)
#define SKEWADAM_ALWAYS_INLINE inline __attribute__((always_inline))
#else
#define SKEWADAM_ALWAYS_INLINE inline
#endif

// SKEWADAM_OPAQUE_FLOAT(x): the compiler forgets how the float (or SIMD
// register) x was formed, so an operation that produced it is never fused
// with one that reads it (an empty asm statement; a volatile round trip
// where there is no such statement).
#if (defined(__GNUC__) || defined(__clang__)) && defined(__x86_64__)
#define SKEWADAM_OPAQUE_FLOAT(x) __asm__("" : "+v"(x))
#elif (defined(__GNUC__) || defined(__clang__)) && defined(__aarch64__)
#define SKEWADAM_OPAQUE_FLOAT(x) __asm__("" : "+w"(x))
#else
#define SKEWADAM_OPAQUE_FLOAT(x)          \
  do {                                    \
    volatile auto skewadam_opaque_ = (x); \
    (x) = skewadam_opaque_;               \
  } while (false)
#endif

namespace skewadam {
/// Every size, index and offset in the library is 64-bit.
using index_t = std::int64_t;
}  // namespace skewadam
