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

namespace skewadam {
/// Every size, index and offset in the library is 64-bit.
using index_t = std::int64_t;
}  // namespace skewadam
