#pragma once
// Which SIMD architecture the CPU kernels run on.
//
// A level is compiled when the compiler flags allow xsimd's tag for it
// (-march=native on an AVX-512 machine allows all three x86 levels):
//
//   level     tag                                    lanes (fp32)
//   avx512    xsimd::avx512bw                        16
//   avx2      xsimd::fma3<xsimd::avx2> or xsimd::avx2 8
//   sse       xsimd::sse4_2 or xsimd::sse2            4
//   neon      xsimd::neon64 (aarch64)                 4
//   scalar    ScalarArch (one element at a time)      1
//
// A program pays for the levels it runs. By default the default CPU backend
// (backend::DefaultBackend = NativeBackend) holds the kernels of the widest
// level the compiler targets alone, fixed at compile time: a build without
// -march runs sse, one with -march=native on an AVX-512 machine avx512.
//
// Defining SKEWADAM_RUNTIME_DISPATCH (for packagers: one binary for several
// processors, and for testing every level on one machine) makes the default
// backend DispatchBackend (CpuBackend<DispatchArch>): it holds the kernels of
// every compiled level and runs the widest the processor supports, unless the
// environment variable SKEWADAM_CPU_ARCH names another one (a level name
// above, or the tag's own name such as "fma3+avx2"). It is read once per
// process, when the first optimizer is built. A name that is unknown, not
// compiled in, or not supported by this processor is an error
// (std::invalid_argument naming the variable and the choices), never a silent
// fallback; so is, for NativeBackend, a SKEWADAM_CPU_ARCH that names another
// level than its own. The macro selects a type: a program's translation
// units may differ in it without breaking the one-definition rule (their
// optimizers are then different types).
//
// CpuBackend<Tag> of an explicit level (ScalarArch, xsimd::avx2...) is
// always available and unaffected by either.

#include <xsimd/xsimd.hpp>

#include <cstdlib>
#include <stdexcept>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

namespace skewadam {

/// Architecture tag for plain scalar code (one element at a time).
struct ScalarArch {
  static constexpr const char* name() noexcept { return "scalar"; }
};

/// The CPU kernel architecture levels, widest first.
enum class CpuArch { avx512, avx2, sse, neon, scalar };

}  // namespace skewadam

namespace skewadam::backend::cpu {

namespace detail {
/// First tag of Tags... that the compiler targets, or void.
template <class... Tags>
struct first_compiled {
  using type = void;
};
template <class T, class... Rest>
struct first_compiled<T, Rest...> {
  using type = std::conditional_t<T::supported(), T, typename first_compiled<Rest...>::type>;
};
}  // namespace detail

/// The xsimd tag of a level in this translation unit, or void when the
/// compiler flags do not allow it.
template <CpuArch L>
struct arch_tag {
  using type = void;
};
template <CpuArch L>
using arch_tag_t = typename arch_tag<L>::type;
template <>
struct arch_tag<CpuArch::avx512> : detail::first_compiled<xsimd::avx512bw> {};
template <>
struct arch_tag<CpuArch::avx2> : detail::first_compiled<xsimd::fma3<xsimd::avx2>, xsimd::avx2> {};
template <>
struct arch_tag<CpuArch::sse> : detail::first_compiled<xsimd::sse4_2, xsimd::sse2> {};
template <>
struct arch_tag<CpuArch::neon> : detail::first_compiled<xsimd::neon64> {};
template <>
struct arch_tag<CpuArch::scalar> {
  using type = ScalarArch;
};

inline constexpr CpuArch all_levels[] = {CpuArch::avx512, CpuArch::avx2, CpuArch::sse, CpuArch::neon,
                                         CpuArch::scalar};

/// The level's short name (what SKEWADAM_CPU_ARCH takes).
constexpr const char* level_name(CpuArch a) noexcept {
  switch (a) {
    case CpuArch::avx512: return "avx512";
    case CpuArch::avx2: return "avx2";
    case CpuArch::sse: return "sse";
    case CpuArch::neon: return "neon";
    case CpuArch::scalar: return "scalar";
  }
  return "?";
}

/// Calls f.template operator()<Tag>() with the level's tag; the level must be
/// compiled in (compiled(a)), or std::invalid_argument is thrown.
template <class F>
decltype(auto) visit_arch(CpuArch a, F&& f) {
  switch (a) {
    case CpuArch::avx512:
      if constexpr (!std::is_void_v<arch_tag_t<CpuArch::avx512>>) return f.template operator()<arch_tag_t<CpuArch::avx512>>();
      break;
    case CpuArch::avx2:
      if constexpr (!std::is_void_v<arch_tag_t<CpuArch::avx2>>) return f.template operator()<arch_tag_t<CpuArch::avx2>>();
      break;
    case CpuArch::sse:
      if constexpr (!std::is_void_v<arch_tag_t<CpuArch::sse>>) return f.template operator()<arch_tag_t<CpuArch::sse>>();
      break;
    case CpuArch::neon:
      if constexpr (!std::is_void_v<arch_tag_t<CpuArch::neon>>) return f.template operator()<arch_tag_t<CpuArch::neon>>();
      break;
    case CpuArch::scalar: break;
  }
  if (a != CpuArch::scalar)
    throw std::invalid_argument(std::string("CPU architecture '") + level_name(a) + "' is not compiled in");
  return f.template operator()<ScalarArch>();
}

/// Whether the level's kernels are compiled into this translation unit.
constexpr bool compiled(CpuArch a) noexcept {
  switch (a) {
    case CpuArch::avx512: return !std::is_void_v<arch_tag_t<CpuArch::avx512>>;
    case CpuArch::avx2: return !std::is_void_v<arch_tag_t<CpuArch::avx2>>;
    case CpuArch::sse: return !std::is_void_v<arch_tag_t<CpuArch::sse>>;
    case CpuArch::neon: return !std::is_void_v<arch_tag_t<CpuArch::neon>>;
    case CpuArch::scalar: return true;
  }
  return false;
}

/// The tag's name of a compiled level ("avx512bw", "fma3+avx2", "scalar"...).
inline const char* tag_name(CpuArch a) {
  return visit_arch(a, []<class A>() { return A::name(); });
}

/// Whether this processor runs the level's compiled kernels (CPUID).
inline bool runs_here(CpuArch a) {
  if (!compiled(a)) return false;
  const auto cpu = xsimd::available_architectures();
  return visit_arch(a, [&]<class A>() {
    if constexpr (std::is_same_v<A, ScalarArch>) return true;
    else return cpu.best >= A::version();
  });
}

/// The levels compiled in and supported by this processor, widest first
/// (scalar is always last).
inline std::vector<CpuArch> available_archs() {
  std::vector<CpuArch> out;
  for (CpuArch a : all_levels)
    if (runs_here(a)) out.push_back(a);
  return out;
}

/// The level named `name` (a level name or a tag's name), checked against
/// what this binary and processor can run; `what` names the source of the
/// name in the error.
inline CpuArch parse_arch(std::string_view name, std::string_view what) {
  std::string choices;
  for (CpuArch a : available_archs()) {
    choices += choices.empty() ? "" : ", ";
    choices += level_name(a);
  }
  for (CpuArch a : all_levels) {
    const bool named = name == level_name(a) || (compiled(a) && name == tag_name(a));
    if (!named) continue;
    if (!compiled(a))
      throw std::invalid_argument(std::string(what) + "=" + std::string(name) +
                                  ": not compiled into this program (its compiler flags do not target it); "
                                  "available: " + choices);
    if (!runs_here(a))
      throw std::invalid_argument(std::string(what) + "=" + std::string(name) +
                                  ": this processor does not support it; available: " + choices);
    return a;
  }
  throw std::invalid_argument(std::string(what) + "=" + std::string(name) +
                              ": unknown CPU architecture; available: " + choices);
}

/// The widest level compiled in (scalar when no SIMD level is).
constexpr CpuArch widest_compiled() noexcept {
  for (CpuArch a : all_levels)
    if (compiled(a)) return a;
  return CpuArch::scalar;
}

/// The tag of the widest level compiled in: the kernels of NativeBackend.
using widest_tag_t = arch_tag_t<widest_compiled()>;

/// The level the dispatching backend runs: SKEWADAM_CPU_ARCH if set (and
/// valid), else the widest available. Decided on the first call; an invalid
/// value throws on every call.
inline CpuArch selected_arch() {
  static const CpuArch chosen = [] {
    const char* env = std::getenv("SKEWADAM_CPU_ARCH");
    if (env != nullptr && *env != '\0') return parse_arch(env, "SKEWADAM_CPU_ARCH");
    return available_archs().front();
  }();
  return chosen;
}

}  // namespace skewadam::backend::cpu

namespace skewadam {

/// Tag of the CPU backend whose level is chosen at run time
/// (backend::cpu::selected_arch()): the default one under
/// SKEWADAM_RUNTIME_DISPATCH.
struct DispatchArch {
  static const char* name() { return backend::cpu::tag_name(backend::cpu::selected_arch()); }
};

}  // namespace skewadam
