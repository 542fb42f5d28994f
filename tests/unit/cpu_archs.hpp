#pragma once
// The CPU architectures a test runs on: the scalar fallback and each SIMD
// level (x86 widths, aarch64 NEON) this translation unit is compiled for,
// by the tags the backend runs them with (engine/backend/cpu/arch.hpp: AVX2 is
// fma3<avx2> where the flags allow FMA).

#include <tuple>
#include <type_traits>
#include <utility>

#include <skewadam/engine/backend/cpu/arch.hpp>
#include <skewadam/engine/backend/cpu/simd.hpp>

namespace skewadam::test {

template <CpuArch L>
using if_compiled = std::conditional_t<std::is_void_v<backend::cpu::arch_tag_t<L>>, std::tuple<>,
                                       std::tuple<backend::cpu::arch_tag_t<L>>>;

/// SIMD levels compiled in, widest first.
using SimdArchs = decltype(std::tuple_cat(std::declval<if_compiled<CpuArch::avx512>>(),
                                          std::declval<if_compiled<CpuArch::avx2>>(),
                                          std::declval<if_compiled<CpuArch::sse>>(),
                                          std::declval<if_compiled<CpuArch::neon>>()));

/// ScalarArch, then SimdArchs.
using CpuArchs = decltype(std::tuple_cat(std::declval<std::tuple<ScalarArch>>(), std::declval<SimdArchs>()));

}  // namespace skewadam::test
