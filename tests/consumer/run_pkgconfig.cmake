# ctest driver: installs skewadam into a fresh prefix under WORK_DIR, then
# compiles tests/consumer/main.cpp with nothing but the compiler and
# `pkg-config --cflags --libs skewadam`, and runs it.
#   cmake -DSOURCE_DIR=... -DWORK_DIR=... -DGENERATOR=... -DCXX=... -DPKG_CONFIG=... -DVERSION=...
#         -P run_pkgconfig.cmake
if(NOT PKG_CONFIG)
  message(FATAL_ERROR "pkg-config was not found when the build was configured (Debian: pkgconf, which "
                      "scripts/install-deps installs)")
endif()
file(REMOVE_RECURSE ${WORK_DIR})
include(${CMAKE_CURRENT_LIST_DIR}/run_command.cmake)

run(_ ${CMAKE_COMMAND} -S ${SOURCE_DIR} -B ${WORK_DIR}/lib -G ${GENERATOR} -DSKEWADAM_BUILD_TESTS=OFF
    -DSKEWADAM_BUILD_TOOLS=OFF -DSKEWADAM_BUILD_EXAMPLES=OFF -DSKEWADAM_BUILD_BENCH=OFF -DSKEWADAM_BUILD_COMPILED=OFF
    -DCMAKE_INSTALL_PREFIX=${WORK_DIR}/prefix)
run(_ ${CMAKE_COMMAND} --install ${WORK_DIR}/lib)
set(ENV{PKG_CONFIG_PATH} ${WORK_DIR}/prefix/share/pkgconfig)
run(_version ${PKG_CONFIG} --modversion skewadam)
if(NOT _version STREQUAL VERSION)
  message(FATAL_ERROR "pkg-config --modversion skewadam: '${_version}', the project is ${VERSION}")
endif()
run(_cflags ${PKG_CONFIG} --cflags skewadam)
run(_libs ${PKG_CONFIG} --libs skewadam)
message(STATUS "pkg-config --cflags skewadam: ${_cflags}\npkg-config --libs skewadam: ${_libs}")
separate_arguments(_cflags UNIX_COMMAND "${_cflags}")
separate_arguments(_libs UNIX_COMMAND "${_libs}")
run(_ ${CXX} -O1 ${_cflags} ${SOURCE_DIR}/tests/consumer/main.cpp ${_libs} -o ${WORK_DIR}/consumer)
run(_out ${WORK_DIR}/consumer)
message(STATUS "${_out}")
