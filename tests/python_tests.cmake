# The Python package (python/, SKEWADAM_WITH_PYTHON): installed into a venv
# of the build folder by the README's command, whenever its sources or the
# library's headers change, and its pytest suite run by ctest: every golden
# case (tests/golden, and SKEWADAM_GOLDEN_DIR's when given) bit for bit
# against skewadam-replay, then the optimizer's behaviour, then checkpoint
# files passed between Python and C++ (skewadam-checkpoint-interop, the C++
# half: checkpoint/interop.cpp).
set(SKEWADAM_PYTHON_VENV ${CMAKE_BINARY_DIR}/python-venv)
file(GLOB_RECURSE _py_sources CONFIGURE_DEPENDS ${PROJECT_SOURCE_DIR}/python/src/*
     ${PROJECT_SOURCE_DIR}/python/skewadam/*.py ${PROJECT_SOURCE_DIR}/include/skewadam/*)
add_custom_command(
  OUTPUT ${SKEWADAM_PYTHON_VENV}/installed.stamp
  COMMAND ${SKEWADAM_PYTHON} -m venv --system-site-packages ${SKEWADAM_PYTHON_VENV}
  COMMAND ${CMAKE_COMMAND} -E env MAX_JOBS=2 PIP_DISABLE_PIP_VERSION_CHECK=1
          ${SKEWADAM_PYTHON_VENV}/bin/pip install --quiet --no-build-isolation --no-deps ${PROJECT_SOURCE_DIR}/python
  COMMAND ${CMAKE_COMMAND} -E touch ${SKEWADAM_PYTHON_VENV}/installed.stamp
  DEPENDS ${_py_sources} ${PROJECT_SOURCE_DIR}/python/setup.py ${PROJECT_SOURCE_DIR}/python/pyproject.toml
  COMMENT "Installing the Python package into ${SKEWADAM_PYTHON_VENV}"
  VERBATIM)
add_custom_target(skewadam-python ALL DEPENDS ${SKEWADAM_PYTHON_VENV}/installed.stamp)

add_executable(skewadam-checkpoint-interop ${CMAKE_CURRENT_LIST_DIR}/checkpoint/interop.cpp)
target_link_libraries(skewadam-checkpoint-interop PRIVATE skewadam::skewadam skewadam_tooling)
skewadam_widest_level_only(skewadam-checkpoint-interop)
if(TARGET skewadam_warnings)
  target_link_libraries(skewadam-checkpoint-interop PRIVATE skewadam_warnings)
endif()

foreach(_suite IN ITEMS golden optimizer checkpoint)
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
