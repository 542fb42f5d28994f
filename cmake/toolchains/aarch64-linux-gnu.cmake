# Cross-compiling for aarch64 Linux with Debian's g++-aarch64-linux-gnu; the
# programs run under qemu-user (Debian's qemu-user), which CTest uses as the
# emulator. scripts/test-aarch64 builds and runs the unit tests and the
# golden cases this way.
#
# The header-only dependencies (Eigen, xsimd, Random123, doctest,
# nlohmann-json, CLI11) are architecture-independent: the host's copies in
# /usr/include are searched after the cross compiler's own system headers
# (-idirafter), so the C library's headers always come from the aarch64
# sysroot.
set(CMAKE_SYSTEM_NAME Linux)
set(CMAKE_SYSTEM_PROCESSOR aarch64)
set(CMAKE_C_COMPILER aarch64-linux-gnu-gcc)
set(CMAKE_CXX_COMPILER aarch64-linux-gnu-g++)
set(CMAKE_CXX_FLAGS_INIT "-idirafter /usr/include")
set(CMAKE_C_FLAGS_INIT "-idirafter /usr/include")
set(CMAKE_CROSSCOMPILING_EMULATOR qemu-aarch64;-L;/usr/aarch64-linux-gnu)

# Debian installs xsimd's CMake package under the build machine's multiarch
# folder (/usr/lib/x86_64-linux-gnu/cmake/xsimd), where a search for aarch64
# packages does not look; the package itself names only headers.
if(NOT xsimd_DIR)
  file(GLOB _skewadam_xsimd_dirs /usr/lib/*-linux-gnu*/cmake/xsimd)
  if(_skewadam_xsimd_dirs)
    list(GET _skewadam_xsimd_dirs 0 _skewadam_xsimd_dir)
    set(xsimd_DIR ${_skewadam_xsimd_dir} CACHE PATH "xsimd's CMake package (headers only)" FORCE)
  endif()
endif()
