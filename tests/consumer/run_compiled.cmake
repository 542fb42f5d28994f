# ctest driver of the compiled mode's package: builds and installs
# skewadam::compiled (portable flags: no -march) into a fresh prefix under
# WORK_DIR, then builds tests/consumer against it twice, through CMake
# (find_package, skewadam::compiled) and through the compiler and
# `pkg-config --cflags --libs skewadam-compiled`, and runs both. The
# consumer's own object must hold no kernel: they are the library's.
#   cmake -DSOURCE_DIR=... -DWORK_DIR=... -DGENERATOR=... -DCXX=... -DPKG_CONFIG=... -DNM=... -DVERSION=...
#         -P run_compiled.cmake
file(REMOVE_RECURSE ${WORK_DIR})
include(${CMAKE_CURRENT_LIST_DIR}/run_command.cmake)
function(no_kernels_in object)
  run(_symbols ${NM} -C --defined-only ${object})
  if(_symbols MATCHES "backend::cpu::Kernels<")
    message(FATAL_ERROR "${object} compiles kernels of its own: the compiled mode's extern declarations "
                        "did not hold")
  endif()
endfunction()

run(_ ${CMAKE_COMMAND} -S ${SOURCE_DIR} -B ${WORK_DIR}/lib -G ${GENERATOR} -DCMAKE_BUILD_TYPE=Release
    -DSKEWADAM_BUILD_TESTS=OFF -DSKEWADAM_BUILD_TOOLS=OFF -DSKEWADAM_BUILD_COMPILED=ON -DSKEWADAM_NATIVE=OFF
    -DCMAKE_INSTALL_PREFIX=${WORK_DIR}/prefix)
run(_ ${CMAKE_COMMAND} --build ${WORK_DIR}/lib)
run(_ ${CMAKE_COMMAND} --install ${WORK_DIR}/lib)

# CMake
run(_ ${CMAKE_COMMAND} -S ${SOURCE_DIR}/tests/consumer -B ${WORK_DIR}/consumer -G ${GENERATOR} -DMODE=compiled
    -DSKEWADAM_VERSION=${VERSION} -DCMAKE_BUILD_TYPE=Release -DCMAKE_PREFIX_PATH=${WORK_DIR}/prefix)
run(_ ${CMAKE_COMMAND} --build ${WORK_DIR}/consumer)
no_kernels_in(${WORK_DIR}/consumer/CMakeFiles/consumer.dir/main.cpp.o)
run(_out ${WORK_DIR}/consumer/consumer)
message(STATUS "CMake: ${_out}")

# pkg-config
file(GLOB_RECURSE _pc ${WORK_DIR}/prefix/skewadam-compiled.pc)
if(NOT _pc)
  message(FATAL_ERROR "no skewadam-compiled.pc was installed under ${WORK_DIR}/prefix")
endif()
get_filename_component(_pc_dir ${_pc} DIRECTORY)
set(ENV{PKG_CONFIG_PATH} "${_pc_dir}:${WORK_DIR}/prefix/share/pkgconfig")
run(_cflags ${PKG_CONFIG} --cflags skewadam-compiled)
run(_libs ${PKG_CONFIG} --libs skewadam-compiled)
message(STATUS "pkg-config --cflags skewadam-compiled: ${_cflags}\npkg-config --libs skewadam-compiled: ${_libs}")
separate_arguments(_cflags UNIX_COMMAND "${_cflags}")
separate_arguments(_libs UNIX_COMMAND "${_libs}")
run(_ ${CXX} -O1 ${_cflags} -c ${SOURCE_DIR}/tests/consumer/main.cpp -o ${WORK_DIR}/consumer-pc.o)
no_kernels_in(${WORK_DIR}/consumer-pc.o)
run(_ ${CXX} ${WORK_DIR}/consumer-pc.o ${_libs} -o ${WORK_DIR}/consumer-pc)
run(_out ${WORK_DIR}/consumer-pc)
message(STATUS "pkg-config: ${_out}")
