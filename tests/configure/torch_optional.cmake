# A failing torch CMake package takes down the whole configure without
# SKEWADAM_TORCH_OPTIONAL, and with it skips the torch half alone: the
# configure succeeds, the demo (a torch target) is left out, the library's
# own targets are there, and SKEWADAM_TORCH_SKIPPED carries torch's error.
#   cmake -DSOURCE_DIR=... -DWORK_DIR=... -DGENERATOR=... -P torch_optional.cmake
foreach(_var SOURCE_DIR WORK_DIR GENERATOR)
  if(NOT DEFINED ${_var})
    message(FATAL_ERROR "torch_optional.cmake: -D${_var}=... is required")
  endif()
endforeach()
# (the broken package in the second folder of a prefix path of two, as
# scripts/gpu-check passes the pack's and torch's)
set(_common -S ${SOURCE_DIR} -G ${GENERATOR} -DSKEWADAM_WITH_TORCH=ON
    "-DCMAKE_PREFIX_PATH=${WORK_DIR}/empty-prefix\;${CMAKE_CURRENT_LIST_DIR}/broken_torch"
    -DSKEWADAM_BUILD_EXAMPLES=ON -DSKEWADAM_BUILD_TESTS=OFF
    -DSKEWADAM_BUILD_TOOLS=OFF -DSKEWADAM_BUILD_COMPILED=OFF -DSKEWADAM_WITH_MPI=OFF)
file(REMOVE_RECURSE ${WORK_DIR})

execute_process(COMMAND ${CMAKE_COMMAND} ${_common} -B ${WORK_DIR}/required
                RESULT_VARIABLE _rc OUTPUT_VARIABLE _out ERROR_VARIABLE _out)
if(_rc EQUAL 0)
  message(FATAL_ERROR "without SKEWADAM_TORCH_OPTIONAL the broken torch package should fail the configure:\n${_out}")
endif()
if(NOT _out MATCHES "broken on purpose")
  message(FATAL_ERROR "the configure failed, but not on the torch package:\n${_out}")
endif()

execute_process(COMMAND ${CMAKE_COMMAND} ${_common} -B ${WORK_DIR}/optional -DSKEWADAM_TORCH_OPTIONAL=ON
                RESULT_VARIABLE _rc OUTPUT_VARIABLE _out ERROR_VARIABLE _out)
if(NOT _rc EQUAL 0)
  message(FATAL_ERROR "with SKEWADAM_TORCH_OPTIONAL the configure should succeed without the torch half:\n${_out}")
endif()
if(NOT _out MATCHES "The torch half is skipped" OR NOT _out MATCHES "broken on purpose")
  message(FATAL_ERROR "the configure should say that the torch half is skipped, and why:\n${_out}")
endif()
file(STRINGS ${WORK_DIR}/optional/CMakeCache.txt _skipped REGEX "^SKEWADAM_TORCH_SKIPPED:")
if(NOT _skipped MATCHES "broken on purpose")
  message(FATAL_ERROR "SKEWADAM_TORCH_SKIPPED should hold torch's error, not '${_skipped}'")
endif()
execute_process(COMMAND ${CMAKE_COMMAND} --build ${WORK_DIR}/optional --target help
                RESULT_VARIABLE _rc OUTPUT_VARIABLE _targets ERROR_VARIABLE _targets)
if(_targets MATCHES "moe_lm")
  message(FATAL_ERROR "the torch half (moe_lm) should be left out:\n${_targets}")
endif()
message(STATUS "torch_optional: the broken torch package fails a plain configure and is skipped with SKEWADAM_TORCH_OPTIONAL")
