# run(OUT_VAR COMMAND...): runs COMMAND, stops the driver naming it and its
# output when it fails, and sets OUT_VAR to its standard output (trailing
# whitespace stripped). Shared by the package drivers of this folder.
function(run out_var)
  execute_process(COMMAND ${ARGN} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err
                  OUTPUT_STRIP_TRAILING_WHITESPACE)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "failed (${rc}): ${ARGN}\n${out}\n${err}")
  endif()
  set(${out_var} "${out}" PARENT_SCOPE)
endfunction()
