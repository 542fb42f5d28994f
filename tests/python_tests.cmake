# The Python package (python/, SKEWADAM_WITH_PYTHON): installed into a venv
# of the build folder by the README's command, whenever its sources or the
# library's headers change, and its pytest suite run by ctest: every golden
# case (tests/golden, and SKEWADAM_GOLDEN_DIR's when given) bit for bit
# against skewadam-replay, then the optimizer's behaviour.
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

foreach(_suite IN ITEMS golden optimizer)
  add_test(NAME python/${_suite}
           COMMAND ${SKEWADAM_PYTHON_VENV}/bin/python -m pytest -q -p no:cacheprovider
                   ${PROJECT_SOURCE_DIR}/python/tests/test_${_suite}.py)
  set(_env "SKEWADAM_REPLAY=$<TARGET_FILE:skewadam-replay>")
  if("golden-external" IN_LIST SKEWADAM_GOLDEN_SETS)
    list(APPEND _env "SKEWADAM_GOLDEN_DIR=${SKEWADAM_GOLDEN_DIR_golden-external}")
  else()
    list(APPEND _env "SKEWADAM_GOLDEN_DIR=")  # this build's setting, not the caller's environment
  endif()
  set_tests_properties(python/${_suite} PROPERTIES LABELS python ENVIRONMENT "${_env}")
endforeach()
