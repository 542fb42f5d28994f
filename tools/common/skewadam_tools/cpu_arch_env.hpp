#pragma once
// For the tools and tests that run under every CPU kernel architecture
// (ctest's golden/<case>/kernels-<level> and large.huge_tensor.<level>
// entries set SKEWADAM_CPU_ARCH): whether the requested architecture is one
// that this program or processor cannot run, in which case the caller skips
// (exit status 77) instead of failing.

#include <cstdlib>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>

#include <skewadam/engine/backend/cpu/arch.hpp>

namespace skewadam::tools {

/// The reason when SKEWADAM_CPU_ARCH names a known architecture level that
/// is not compiled in or not supported here; nullopt when it is unset,
/// available, or unknown (an unknown name is an error the library reports).
inline std::optional<std::string> requested_arch_unavailable() {
  const char* env = std::getenv("SKEWADAM_CPU_ARCH");
  if (env == nullptr || *env == '\0') return std::nullopt;
  try {
    (void)backend::cpu::parse_arch(env, "SKEWADAM_CPU_ARCH");
    return std::nullopt;
  } catch (const std::invalid_argument& e) {
    for (CpuArch a : backend::cpu::all_levels)
      if (std::string_view(env) == backend::cpu::level_name(a)) return std::string(e.what());
    return std::nullopt;
  }
}

}  // namespace skewadam::tools
