# The CUDA kernels run on host threads (tests/emulation/): no GPU and no CUDA
# toolkit needed, but slow (minutes), hence opt-in:
#   -DSKEWADAM_CUDA_EMULATION_TESTS=ON
add_executable(skewadam-cuda-emulation-tests emulation/test_cuda_kernels_emulated.cpp)
target_link_libraries(skewadam-cuda-emulation-tests PRIVATE skewadam::skewadam skewadam_tooling doctest::doctest)
find_package(Threads REQUIRED)
target_link_libraries(skewadam-cuda-emulation-tests PRIVATE Threads::Threads)
target_compile_definitions(skewadam-cuda-emulation-tests PRIVATE SKEWADAM_GOLDEN_DIR="${SKEWADAM_GOLDEN_DIR}")
add_test(NAME cuda-emulation/kernels COMMAND skewadam-cuda-emulation-tests)
set_tests_properties(cuda-emulation/kernels PROPERTIES LABELS "cuda-emulation" TIMEOUT 3600)
