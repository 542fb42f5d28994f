# Extra ctest entries of the performance work, for tests/CMakeLists.txt to
# include(). Timings are never asserted here: the figures come from
# skewadam-bench and bench/compare.py (bench/RESULTS.md).

# skewadam-bench runs (small shapes only, a handful of iterations), and what
# it printed is checked (tests/support/check_bench.py): every row, finite
# times, a copy kernel within any machine's range, the kernels' CPU level.
if(TARGET skewadam-bench)
  add_test(NAME skewadam-bench-smoke
           COMMAND ${SKEWADAM_PYTHON} ${CMAKE_CURRENT_SOURCE_DIR}/support/check_bench.py $<TARGET_FILE:skewadam-bench>)
  skewadam_full_only(skewadam-bench-smoke)
endif()
