# ctest driver: builds tests/consumer against skewadam in MODE and runs it.
file(REMOVE_RECURSE ${WORK_DIR})
function(run)
  execute_process(COMMAND ${ARGN} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "failed (${rc}): ${ARGN}\n${out}\n${err}")
  endif()
  message(STATUS "${out}")
endfunction()

set(_consumer_args -DMODE=${MODE} -DSKEWADAM_SOURCE=${SOURCE_DIR} -DSKEWADAM_VERSION=${VERSION}
    -DCMAKE_BUILD_TYPE=Release)
if(MODE STREQUAL "installed")
  run(${CMAKE_COMMAND} -S ${SOURCE_DIR} -B ${WORK_DIR}/lib -G ${GENERATOR} -DSKEWADAM_BUILD_TESTS=OFF
      -DSKEWADAM_BUILD_TOOLS=OFF -DSKEWADAM_BUILD_EXAMPLES=OFF -DSKEWADAM_BUILD_BENCH=OFF -DSKEWADAM_BUILD_COMPILED=OFF
      -DCMAKE_INSTALL_PREFIX=${WORK_DIR}/prefix)
  run(${CMAKE_COMMAND} --install ${WORK_DIR}/lib)
  list(APPEND _consumer_args -DCMAKE_PREFIX_PATH=${WORK_DIR}/prefix)
endif()
run(${CMAKE_COMMAND} -S ${SOURCE_DIR}/tests/consumer -B ${WORK_DIR}/consumer -G ${GENERATOR} ${_consumer_args})
run(${CMAKE_COMMAND} --build ${WORK_DIR}/consumer)
run(${WORK_DIR}/consumer/consumer)
