# Dependencies of the skewadam INTERFACE target. Used both by the build and by
# the installed package (skewadamConfig.cmake includes this file).
include(CMakeFindDependencyMacro)

find_dependency(Eigen3 3.3 NO_MODULE)
find_dependency(OpenMP)

# Debian's xsimd package config names an `xtl` target without depending on it.
if(NOT TARGET xtl)
  find_package(xtl QUIET)
  if(NOT TARGET xtl)
    add_library(xtl INTERFACE IMPORTED)
  endif()
endif()
find_dependency(xsimd 8)

# Random123 is header-only and ships no CMake package.
if(NOT TARGET skewadam_random123)
  find_path(SKEWADAM_RANDOM123_INCLUDE_DIR Random123/philox.h REQUIRED)
  add_library(skewadam_random123 INTERFACE IMPORTED)
  set_target_properties(skewadam_random123 PROPERTIES
    INTERFACE_INCLUDE_DIRECTORIES "${SKEWADAM_RANDOM123_INCLUDE_DIR}")
endif()
