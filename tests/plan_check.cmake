# Runs skewadam-plan once and checks its exit status and output.
# cmake -DPLAN=<exe> -DARGS=<a|b|...> -DRC=<status> [-DOUT_HAS=<x|y>] [-DERR_HAS=<x|y>] -P plan_check.cmake
# ARGS, OUT_HAS and ERR_HAS are lists separated by '|'; OUT_HAS and ERR_HAS
# are literal fragments that stdout and stderr must contain.
string(REPLACE "|" ";" _args "${ARGS}")
execute_process(COMMAND "${PLAN}" ${_args}
                RESULT_VARIABLE _rc OUTPUT_VARIABLE _out ERROR_VARIABLE _err)
set(_failed "")
if(NOT "${_rc}" STREQUAL "${RC}")
  string(APPEND _failed "exit status ${_rc}, expected ${RC}\n")
endif()
foreach(_stream IN ITEMS OUT ERR)
  if(_stream STREQUAL "OUT")
    set(_text "${_out}")
  else()
    set(_text "${_err}")
  endif()
  string(REPLACE "|" ";" _fragments "${${_stream}_HAS}")
  foreach(_fragment IN LISTS _fragments)
    string(FIND "${_text}" "${_fragment}" _at)
    if(_at EQUAL -1)
      string(APPEND _failed "std${_stream} lacks '${_fragment}'\n")
    endif()
  endforeach()
endforeach()
if(_failed)
  message(FATAL_ERROR "skewadam-plan ${_args}\n${_failed}--- stdout:\n${_out}--- stderr:\n${_err}")
endif()
