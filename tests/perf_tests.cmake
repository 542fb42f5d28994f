# Extra ctest entries of the performance work, for tests/CMakeLists.txt to
# include(). Timings are never asserted here: the figures come from
# skewadam-bench and bench/compare.py (bench/RESULTS.md).

# skewadam-bench runs (small shapes only, a handful of iterations).
if(TARGET skewadam-bench)
  add_test(NAME skewadam-bench-smoke
    COMMAND skewadam-bench
      "--benchmark_filter=^step/(router/(f32|bf16)/128x4096|backbone/(f32|bf16)/128tensors_64x256_256)/threads:(1|2)"
      --benchmark_min_time=0.001)
endif()
