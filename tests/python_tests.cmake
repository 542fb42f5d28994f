# The Python package (python/, SKEWADAM_WITH_PYTHON), installed into a venv
# of the build folder (python/CMakeLists.txt), and its pytest suite run by
# ctest: every golden
# case (tests/golden, and SKEWADAM_GOLDEN_DIR's when given) bit for bit
# against skewadam-replay, then the optimizer's behaviour, then checkpoint
# files passed between Python and C++ (skewadam-checkpoint-interop, the C++
# half: checkpoint/interop.cpp).
add_executable(skewadam-checkpoint-interop ${CMAKE_CURRENT_LIST_DIR}/checkpoint/interop.cpp)
target_link_libraries(skewadam-checkpoint-interop PRIVATE skewadam::skewadam skewadam_tooling)
skewadam_test_program(skewadam-checkpoint-interop)
if(TARGET skewadam_warnings)
  target_link_libraries(skewadam-checkpoint-interop PRIVATE skewadam_warnings)
endif()

foreach(_suite IN ITEMS golden optimizer step_in_backward checkpoint)
  add_test(NAME python/${_suite}
           COMMAND ${SKEWADAM_PYTHON_VENV}/bin/python -m pytest -q -p no:cacheprovider
                   ${PROJECT_SOURCE_DIR}/python/tests/test_${_suite}.py)
  set(_env "SKEWADAM_REPLAY=$<TARGET_FILE:skewadam-replay>"
           "SKEWADAM_CHECKPOINT_INTEROP=$<TARGET_FILE:skewadam-checkpoint-interop>")
  if("golden-external" IN_LIST SKEWADAM_GOLDEN_SETS)
    list(APPEND _env "SKEWADAM_GOLDEN_DIR=${SKEWADAM_GOLDEN_DIR_golden-external}")
  else()
    list(APPEND _env "SKEWADAM_GOLDEN_DIR=")  # this build's setting, not the caller's environment
  endif()
  set_tests_properties(python/${_suite} PROPERTIES LABELS python ENVIRONMENT "${_env}")
endforeach()
