#pragma once
// The CPU architectures a test runs on: the scalar fallback and each SIMD
// architecture (x86 widths, aarch64 NEON) this translation unit is compiled
// for (xsimd's supported()).

#include <tuple>
#include <type_traits>
#include <utility>

#include <skewadam/backend/cpu/simd.hpp>

namespace skewadam::test {

template <class Arch>
using if_compiled = std::conditional_t<Arch::supported(), std::tuple<Arch>, std::tuple<>>;

/// SIMD architectures compiled in, widest first.
using SimdArchs = decltype(std::tuple_cat(std::declval<if_compiled<xsimd::avx512bw>>(),
                                          std::declval<if_compiled<xsimd::avx2>>(),
                                          std::declval<if_compiled<xsimd::sse4_2>>(),
                                          std::declval<if_compiled<xsimd::neon64>>()));

/// ScalarArch, then SimdArchs.
using CpuArchs = decltype(std::tuple_cat(std::declval<std::tuple<ScalarArch>>(), std::declval<SimdArchs>()));

}  // namespace skewadam::test
