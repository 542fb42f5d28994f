# The torch half compiled against another LibTorch's headers alone, with no
# library to link: SKEWADAM_TORCH_HEADERS names the include folder of a
# LibTorch with CUDA (scripts/torch-headers extracts torch 2.x's from a
# Debian package), whose headers then come before the system's. Object
# libraries, built and never linked (CI's CUDA section builds them):
#   skewadam-torch-headers-cxx   the adapter's tests as skewadam-torch-cuda-tests
#                                compiles them (one unit), the Python
#                                module's source and the moe_lm demo's;
#   skewadam-torch-headers-cuda  with nvcc: the CUDA engines' translation unit
#                                (torch/cuda.cuh, every variant): the Python
#                                package's, whose two lines the tests' and
#                                the demo's repeat.
# Included by tests/CMakeLists.txt.

if(NOT EXISTS ${SKEWADAM_TORCH_HEADERS}/torch/csrc/api/include/torch/torch.h OR
   NOT EXISTS ${SKEWADAM_TORCH_HEADERS}/c10/cuda/impl/cuda_cmake_macros.h)
  message(FATAL_ERROR "SKEWADAM_TORCH_HEADERS=${SKEWADAM_TORCH_HEADERS}: not the include folder of a LibTorch with "
                      "CUDA (torch/csrc/api/include/torch/torch.h and c10/cuda/impl/cuda_cmake_macros.h; "
                      "scripts/torch-headers DIR extracts one)")
endif()
if(NOT SKEWADAM_WITH_CUDA OR NOT TARGET skewadam::cuda)
  message(FATAL_ERROR "SKEWADAM_TORCH_HEADERS: the torch half against a CUDA LibTorch's headers needs "
                      "-DSKEWADAM_WITH_CUDA=ON (nvcc and the CUDA toolkit's headers)")
endif()
if(NOT TARGET doctest::doctest)
  find_package(doctest REQUIRED)
endif()
# (the Python the project's tests use, whose headers python3-dev installs)
if(SKEWADAM_PYTHON AND NOT DEFINED Python3_EXECUTABLE)
  set(Python3_EXECUTABLE ${SKEWADAM_PYTHON})
endif()
find_package(Python3 REQUIRED COMPONENTS Interpreter Development.Module)

# What torch's CMake package gives its users (TORCH_CXX_FLAGS and the torch
# targets' compile definitions, a distributed build with Gloo and NCCL).
set(_torch_headers ${SKEWADAM_TORCH_HEADERS} ${SKEWADAM_TORCH_HEADERS}/torch/csrc/api/include)
set(_torch_definitions USE_DISTRIBUTED USE_C10D_GLOO USE_C10D_NCCL USE_RPC USE_TENSORPIPE _GLIBCXX_USE_CXX11_ABI=1)

set(_unit_torch ${CMAKE_CURRENT_LIST_DIR}/unit_torch)
add_library(skewadam-torch-headers-cxx OBJECT
  ${_unit_torch}/main.cpp ${_unit_torch}/test_adapter.cpp ${_unit_torch}/test_demo_report.cpp
  ${_unit_torch}/test_in_backward.cpp ${_unit_torch}/test_serialize.cpp ${_unit_torch}/test_tier_rules.cpp
  ${_unit_torch}/test_training.cpp
  ${PROJECT_SOURCE_DIR}/python/src/module.cpp
  ${PROJECT_SOURCE_DIR}/examples/moe_lm/main.cpp)
# (the tests in one unit, as skewadam-torch-cuda-tests compiles them; the
# Python module and the demo, which define main-like entry points, apart)
set_source_files_properties(${PROJECT_SOURCE_DIR}/python/src/module.cpp ${PROJECT_SOURCE_DIR}/examples/moe_lm/main.cpp
                            PROPERTIES SKIP_UNITY_BUILD_INCLUSION ON)
set_target_properties(skewadam-torch-headers-cxx PROPERTIES UNITY_BUILD ON UNITY_BUILD_BATCH_SIZE 0)
target_include_directories(skewadam-torch-headers-cxx SYSTEM BEFORE PRIVATE ${_torch_headers})
target_include_directories(skewadam-torch-headers-cxx PRIVATE ${_unit_torch} ${PROJECT_SOURCE_DIR}/examples/moe_lm
                           ${PROJECT_SOURCE_DIR}/python/src)
target_compile_definitions(skewadam-torch-headers-cxx PRIVATE ${_torch_definitions} SKEWADAM_TORCH_TEST_CUDA
                           SKEWADAM_PYTHON_WITH_CUDA MOE_LM_WITH_CUDA=1 TORCH_EXTENSION_NAME=_skewadam)
target_link_libraries(skewadam-torch-headers-cxx PRIVATE skewadam::skewadam doctest::doctest Python3::Module
                      CUDA::cudart)
if(TARGET skewadam_tooling)
  target_link_libraries(skewadam-torch-headers-cxx PRIVATE skewadam_tooling)
endif()
target_compile_features(skewadam-torch-headers-cxx PRIVATE cxx_std_20)
# (compiled to check, never run: unoptimized)
target_compile_options(skewadam-torch-headers-cxx PRIVATE -O0)

add_library(skewadam-torch-headers-cuda OBJECT ${PROJECT_SOURCE_DIR}/python/src/cuda_engines.cu)
target_include_directories(skewadam-torch-headers-cuda SYSTEM BEFORE PRIVATE ${_torch_headers})
target_compile_definitions(skewadam-torch-headers-cuda PRIVATE ${_torch_definitions})
target_link_libraries(skewadam-torch-headers-cuda PRIVATE skewadam::cuda)
target_compile_options(skewadam-torch-headers-cuda PRIVATE -O0 $<$<COMPILE_LANGUAGE:CUDA>:-Ofc=max>)
