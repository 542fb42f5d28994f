# The LibTorch adapter's tests: a separate doctest executable, since it needs
# LibTorch (Debian: libtorch-dev). Included by tests/CMakeLists.txt; without
# LibTorch it adds nothing. The tests also build the demo's model
# (examples/moe_lm/model.hpp). main.cpp includes the adapter header first, so
# the executable also checks that the header compiles alone.

find_package(Torch QUIET)
if(NOT Torch_FOUND)
  message(STATUS "LibTorch not found (Debian: apt-get install libtorch-dev): the adapter's tests are not built")
  return()
endif()

if(NOT TARGET doctest::doctest)
  find_package(doctest REQUIRED)
endif()

# The adapter's tests, which hold whatever its engine: compiled once for both
# executables below.
set(_torch_common_sources
  ${CMAKE_CURRENT_LIST_DIR}/unit_torch/test_demo_report.cpp
  ${CMAKE_CURRENT_LIST_DIR}/unit_torch/test_in_backward.cpp
  ${CMAKE_CURRENT_LIST_DIR}/unit_torch/test_serialize.cpp
  ${CMAKE_CURRENT_LIST_DIR}/unit_torch/test_tier_rules.cpp
  ${CMAKE_CURRENT_LIST_DIR}/unit_torch/test_training.cpp)
set(_torch_test_includes ${CMAKE_CURRENT_LIST_DIR}/unit_torch ${CMAKE_CURRENT_LIST_DIR}/../examples/moe_lm)
add_library(skewadam-torch-test-common OBJECT ${_torch_common_sources}
            ${CMAKE_CURRENT_LIST_DIR}/unit_torch/test_adapter.cpp)
# (each executable compiles main.cpp, the cheapest of the sources)
target_include_directories(skewadam-torch-test-common PUBLIC ${_torch_test_includes})
target_link_libraries(skewadam-torch-test-common PUBLIC skewadam::skewadam ${TORCH_LIBRARIES} doctest::doctest)
target_compile_features(skewadam-torch-test-common PUBLIC cxx_std_20)
# (public: the executables' own sources, linked with these, are compiled alike)
target_link_libraries(skewadam-torch-test-common PUBLIC skewadam_tooling)
target_compile_options(skewadam-torch-test-common PUBLIC
                       $<$<AND:$<CXX_COMPILER_ID:GNU,Clang>,$<CONFIG:Release,RelWithDebInfo,MinSizeRel>>:-O1>
                       ${SKEWADAM_TEST_PROGRAM_FLAGS})
skewadam_unity_tests(skewadam-torch-test-common 6)
if(TARGET skewadam_warnings)
  target_link_libraries(skewadam-torch-test-common PUBLIC skewadam_warnings)
endif()

add_executable(skewadam-torch-tests ${CMAKE_CURRENT_LIST_DIR}/unit_torch/main.cpp)
target_link_libraries(skewadam-torch-tests PRIVATE skewadam-torch-test-common)

add_test(NAME torch-adapter COMMAND skewadam-torch-tests)
# Two threads whatever the machine (the results must not depend on it), which
# wait by sleeping: spinning OpenMP threads slow a shared runner down by an
# order of magnitude.
set_tests_properties(torch-adapter PROPERTIES LABELS "torch"
                     ENVIRONMENT "OMP_NUM_THREADS=2;OMP_WAIT_POLICY=passive")

# The same tests over a device engine: the CUDA backend on the emulated
# runtime, registered for CPU tensors (unit_torch/device_engine_emulated.cpp),
# so that the path CUDA tensors take through the adapter runs without a GPU
# (the full tier: the adapter's tests and the emulated engine's run in the
# fast one apart).
if(SKEWADAM_CUDA_EMULATION_TESTS AND TARGET skewadam_tooling AND SKEWADAM_FULL_TESTS)
  add_executable(skewadam-torch-device-tests ${CMAKE_CURRENT_LIST_DIR}/unit_torch/main.cpp
                 ${CMAKE_CURRENT_LIST_DIR}/unit_torch/device_engine_emulated.cpp)
  target_link_libraries(skewadam-torch-device-tests PRIVATE skewadam-torch-test-common skewadam_tooling)
  # (the two training runs are left out: 80 s on the emulated kernels, and
  # their steps are those the other cases check bit for bit)
  add_test(NAME torch-adapter/device-engine-emulated
           COMMAND skewadam-torch-device-tests "--test-case-exclude=*training run*")
  set_tests_properties(torch-adapter/device-engine-emulated PROPERTIES LABELS "torch;cuda-emulation;full"
                       ENVIRONMENT "OMP_NUM_THREADS=2;OMP_WAIT_POLICY=passive")
endif()

# The same tests on CUDA tensors, where LibTorch is a CUDA build and the
# project's CUDA backend is on (-DSKEWADAM_WITH_CUDA=ON): every source
# compiled again with SKEWADAM_TORCH_TEST_CUDA (the tests' tensors on the
# GPU), and unit_torch/cuda_engines.cu, compiled by nvcc, registering the
# library's CUDA engines. scripts/gpu-check builds and runs them; without a
# GPU they are skipped.
if(SKEWADAM_WITH_CUDA AND CAFFE2_USE_CUDA AND TARGET skewadam::cuda)
  add_executable(skewadam-torch-cuda-tests ${CMAKE_CURRENT_LIST_DIR}/unit_torch/main.cpp ${_torch_common_sources}
    ${CMAKE_CURRENT_LIST_DIR}/unit_torch/test_adapter.cpp
    ${CMAKE_CURRENT_LIST_DIR}/unit_torch/cuda_engines.cu)
  target_include_directories(skewadam-torch-cuda-tests PRIVATE ${_torch_test_includes})
  target_link_libraries(skewadam-torch-cuda-tests PRIVATE skewadam::cuda ${TORCH_LIBRARIES} doctest::doctest)
  target_compile_features(skewadam-torch-cuda-tests PRIVATE cxx_std_20)
  target_compile_definitions(skewadam-torch-cuda-tests PRIVATE SKEWADAM_TORCH_TEST_CUDA)
  # The tests' own C++ at -O1, as the CPU tests' (the kernels they run are
  # nvcc's and skewadam::compiled's): half the compile time of -O3 for the
  # GPU check's build phase, whose longest units these are.
  target_compile_options(skewadam-torch-cuda-tests PRIVATE
                         $<$<AND:$<COMPILE_LANGUAGE:CXX>,$<CXX_COMPILER_ID:GNU,Clang>,$<CONFIG:Release,RelWithDebInfo,MinSizeRel>>:-O1>)
  add_test(NAME torch-adapter/cuda COMMAND skewadam-torch-cuda-tests)
  set_tests_properties(torch-adapter/cuda PROPERTIES LABELS "torch;torch-cuda" SKIP_RETURN_CODE 77
                       ENVIRONMENT "OMP_NUM_THREADS=2;OMP_WAIT_POLICY=passive")
elseif(SKEWADAM_WITH_CUDA AND TARGET skewadam::cuda)
  # A CPU-only LibTorch (Debian's) still ships c10's CUDA headers, all but the
  # one its CUDA build generates (c10/cuda/impl/cuda_cmake_macros.h). With that
  # one written here, nvcc compiles the CUDA engines' translation unit
  # (torch/cuda.cuh, every variant) against them: an object library, built by
  # CI; it cannot be linked without a CUDA LibTorch.
  find_file(SKEWADAM_C10_CUDA_GUARD c10/cuda/CUDAGuard.h PATHS ${TORCH_INCLUDE_DIRS} NO_DEFAULT_PATH)
  if(SKEWADAM_C10_CUDA_GUARD)
    set(_c10_generated ${CMAKE_CURRENT_BINARY_DIR}/c10_cuda_generated)
    file(WRITE ${_c10_generated}/c10/cuda/impl/cuda_cmake_macros.h
         "#pragma once\n// written by tests/torch_tests.cmake: a CUDA build of LibTorch generates this file\n#define C10_CUDA_BUILD_SHARED_LIBS\n")
    add_library(skewadam-torch-cuda-compile OBJECT ${CMAKE_CURRENT_LIST_DIR}/unit_torch/cuda_engines.cu)
    target_include_directories(skewadam-torch-cuda-compile SYSTEM PRIVATE ${_c10_generated} ${TORCH_INCLUDE_DIRS})
    target_link_libraries(skewadam-torch-cuda-compile PRIVATE skewadam::cuda)
  endif()
endif()

# Sharding over a torch process group: Gloo on the CPU, 2 to 4 processes
# meeting through a FileStore (tests/torch_dist). Needs LibTorch's c10d
# headers and Gloo's (Debian: libgloo-dev). The full tier's: the sharded
# placement runs in the fast one over MPI and threads.
if(NOT SKEWADAM_FULL_TESTS)
  return()
endif()
find_path(SKEWADAM_GLOO_INCLUDE gloo/algorithm.h)
find_library(SKEWADAM_GLOO_LIBRARY gloo)
if(NOT SKEWADAM_GLOO_INCLUDE OR NOT SKEWADAM_GLOO_LIBRARY)
  message(STATUS "Gloo headers not found (Debian: apt-get install libgloo-dev): the process-group tests are not built")
  return()
endif()
if(NOT TARGET skewadam_tooling)
  message(STATUS "skewadam_tooling is not built (SKEWADAM_BUILD_TOOLS=OFF): the process-group tests are not built")
  return()
endif()
add_executable(skewadam-torch-gloo-tests ${CMAKE_CURRENT_LIST_DIR}/torch_dist/test_process_group_gloo.cpp)
target_include_directories(skewadam-torch-gloo-tests SYSTEM PRIVATE ${SKEWADAM_GLOO_INCLUDE})
target_include_directories(skewadam-torch-gloo-tests PRIVATE ${CMAKE_CURRENT_LIST_DIR}/unit_torch)
target_link_libraries(skewadam-torch-gloo-tests PRIVATE skewadam::skewadam skewadam_tooling ${TORCH_LIBRARIES}
                      ${SKEWADAM_GLOO_LIBRARY})
target_compile_features(skewadam-torch-gloo-tests PRIVATE cxx_std_20)
skewadam_test_program(skewadam-torch-gloo-tests)
if(TARGET skewadam_warnings)
  target_link_libraries(skewadam-torch-gloo-tests PRIVATE skewadam_warnings)
endif()
foreach(ranks 2 3 4)
  add_test(NAME torch-gloo/ranks-${ranks} COMMAND skewadam-torch-gloo-tests --ranks ${ranks})
  set_tests_properties(torch-gloo/ranks-${ranks} PROPERTIES LABELS "torch;gloo;full" TIMEOUT 600
                       ENVIRONMENT "OMP_NUM_THREADS=1;OMP_WAIT_POLICY=passive")
endforeach()
# The same adapter checks over the sharded device engine (the path of CUDA
# tensors with a process group), its kernels emulated on the host.
foreach(ranks 2 3)
  add_test(NAME torch-gloo/ranks-${ranks}/device-engine-emulated
           COMMAND skewadam-torch-gloo-tests --ranks ${ranks} --device-engine)
  set_tests_properties(torch-gloo/ranks-${ranks}/device-engine-emulated PROPERTIES
                       LABELS "torch;gloo;cuda-emulation;full" TIMEOUT 600
                       ENVIRONMENT "OMP_NUM_THREADS=1;OMP_WAIT_POLICY=passive")
endforeach()
