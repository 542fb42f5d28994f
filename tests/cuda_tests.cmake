# The CUDA backend's tests (SKEWADAM_WITH_CUDA). Built and registered on every
# machine; without a CUDA device each reports itself skipped (exit 77).
add_executable(skewadam-cuda-tests cuda/test_cuda.cpp)
target_link_libraries(skewadam-cuda-tests PRIVATE skewadam_cuda_runner skewadam_tooling skewadam_warnings
                      doctest::doctest)
skewadam_golden_definitions(skewadam-cuda-tests)
# The CPU side of the bf16 parity test must round like the CUDA code, which
# is compiled without contraction (-fmad=false).
target_compile_options(skewadam-cuda-tests PRIVATE $<$<CXX_COMPILER_ID:GNU,Clang>:-ffp-contract=off>)

foreach(_tc IN ITEMS
    "golden cases pass on the GPU"
    "fp32: the GPU agrees with the CPU backend within the golden tolerance"
    "bf16 with stochastic rounding: bit-identical to the CPU backend"
    "stochastic rounding: the GPU gives the CPU's bits for the same value and key"
    "the GPU step is deterministic"
    "step scalars: the GPU forms the host's bits"
    "bad input raises std::invalid_argument naming the argument")
  string(REGEX REPLACE "[^A-Za-z0-9]+" "-" _id "${_tc}")
  string(REGEX REPLACE "-$" "" _id "${_id}")
  string(REPLACE "," "\\," _filter "${_tc}")
  add_test(NAME cuda/${_id} COMMAND skewadam-cuda-tests "--test-case=${_filter}")
  set_tests_properties(cuda/${_id} PROPERTIES SKIP_RETURN_CODE 77 LABELS cuda RESOURCE_LOCK gpu)
endforeach()

# Every golden case (each set) through skewadam-replay --backend cuda.
foreach(_set IN LISTS SKEWADAM_GOLDEN_SETS)
  foreach(_case IN LISTS SKEWADAM_GOLDEN_CASES_${_set})
    get_filename_component(_name ${_case} NAME)
    set(_out ${CMAKE_CURRENT_BINARY_DIR}/golden-out/${_set}/${_name}-cuda)
    add_test(NAME ${_set}/${_name}/cuda COMMAND skewadam-replay ${_case} --backend cuda --out ${_out})
    set_tests_properties(${_set}/${_name}/cuda PROPERTIES SKIP_RETURN_CODE 77 LABELS cuda RESOURCE_LOCK gpu)
  endforeach()
endforeach()

# The optimizer front-end over the CUDA backend and runtime (skewadam/cuda.cuh).
add_executable(skewadam-cuda-engine-tests cuda/test_cuda_engine.cu)
target_link_libraries(skewadam-cuda-engine-tests PRIVATE skewadam::cuda skewadam_tooling doctest::doctest)
target_include_directories(skewadam-cuda-engine-tests PRIVATE ${CMAKE_CURRENT_SOURCE_DIR}/support)
skewadam_golden_definitions(skewadam-cuda-engine-tests)
add_test(NAME cuda/front-end COMMAND skewadam-cuda-engine-tests)
set_tests_properties(cuda/front-end PROPERTIES SKIP_RETURN_CODE 77 LABELS cuda RESOURCE_LOCK gpu)

# The sharded CUDA engine on the GPU against the local one (cuda/test_sharded_gpu.cu,
# the checks of mpi/sharded_checks.hpp): MPI ranks sharing the GPU, and NCCL at
# one rank, where the build has them.
add_executable(skewadam-sharded-gpu-tests cuda/test_sharded_gpu.cu)
target_link_libraries(skewadam-sharded-gpu-tests PRIVATE skewadam::cuda)
if(SKEWADAM_MPI_ENABLED)
  target_link_libraries(skewadam-sharded-gpu-tests PRIVATE MPI::MPI_CXX)
  target_compile_definitions(skewadam-sharded-gpu-tests PRIVATE SKEWADAM_TEST_WITH_MPI)
endif()
if(SKEWADAM_NCCL_ENABLED)
  target_link_libraries(skewadam-sharded-gpu-tests PRIVATE ${SKEWADAM_NCCL_LIBRARY})
  target_include_directories(skewadam-sharded-gpu-tests PRIVATE ${SKEWADAM_NCCL_INCLUDE_DIR})
  target_compile_definitions(skewadam-sharded-gpu-tests PRIVATE SKEWADAM_TEST_WITH_NCCL)
  add_test(NAME cuda/sharded/nccl-1-rank COMMAND skewadam-sharded-gpu-tests --comm nccl)
  set_tests_properties(cuda/sharded/nccl-1-rank PROPERTIES SKIP_RETURN_CODE 77 LABELS cuda RESOURCE_LOCK gpu)
endif()
