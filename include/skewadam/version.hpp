#pragma once
// skewadam version. CMake reads the three numbers below.

#define SKEWADAM_VERSION_MAJOR 0
#define SKEWADAM_VERSION_MINOR 2
#define SKEWADAM_VERSION_PATCH 0

namespace skewadam {
inline constexpr int version_major = SKEWADAM_VERSION_MAJOR;
inline constexpr int version_minor = SKEWADAM_VERSION_MINOR;
inline constexpr int version_patch = SKEWADAM_VERSION_PATCH;
}  // namespace skewadam
