# cmake -DREPLAY=... -DCASE=dir -DWORK=dir [-DBACKEND=name] [-DPOINTS=inner] -P resume_case.cmake
#
# Runs a golden case uninterrupted (1 thread), then resumed at several steps
# (2 threads): steps 0, 1, N/2, N-1 and N, or with POINTS=inner 1 and N/2
# alone; in one process with --resume-at, and in two with --stop-after
# --save and --load. Every output must equal the uninterrupted run's, bit for
# bit, and every run must pass the case's tolerances. BACKEND, when given, is
# passed to every run as --backend (e.g. cuda-emulated).
cmake_minimum_required(VERSION 3.25)
foreach(_v REPLAY CASE WORK)
  if(NOT DEFINED ${_v})
    message(FATAL_ERROR "resume_case.cmake: -D${_v}= is required")
  endif()
endforeach()

file(READ "${CASE}/case.json" _json)
string(JSON _steps GET "${_json}" steps)
math(EXPR _mid "${_steps} / 2")
math(EXPR _last "${_steps} - 1")
set(_ks 0 1 ${_mid} ${_last} ${_steps})
if(POINTS STREQUAL "inner")
  set(_ks 1 ${_mid})
endif()
list(REMOVE_DUPLICATES _ks)

file(REMOVE_RECURSE "${WORK}")
file(MAKE_DIRECTORY "${WORK}")

set(_backend "")
if(DEFINED BACKEND)
  set(_backend --backend ${BACKEND})
endif()

function(run)
  execute_process(COMMAND ${ARGN} ${_backend} RESULT_VARIABLE _rc OUTPUT_VARIABLE _out ERROR_VARIABLE _err)
  if(NOT _rc STREQUAL "0")
    message(FATAL_ERROR "failed (${_rc}): ${ARGN}\n${_out}${_err}")
  endif()
endfunction()

function(same_files a b)
  file(GLOB _files RELATIVE "${a}" "${a}/*.npy")
  if(NOT _files)
    message(FATAL_ERROR "no outputs in ${a}")
  endif()
  foreach(_f IN LISTS _files)
    if(NOT EXISTS "${b}/${_f}")
      message(FATAL_ERROR "${b}/${_f} is missing")
    endif()
    file(SHA256 "${a}/${_f}" _ha)
    file(SHA256 "${b}/${_f}" _hb)
    if(NOT _ha STREQUAL _hb)
      message(FATAL_ERROR "${b}/${_f} differs from the uninterrupted run's ${a}/${_f}")
    endif()
  endforeach()
endfunction()

run("${REPLAY}" "${CASE}" --threads 1 --out "${WORK}/full")
foreach(_k IN LISTS _ks)
  run("${REPLAY}" "${CASE}" --threads 2 --resume-at ${_k} --out "${WORK}/resume-${_k}")
  same_files("${WORK}/full" "${WORK}/resume-${_k}")

  # two processes: the state files after the last step must be identical
  run("${REPLAY}" "${CASE}" --threads 2 --stop-after ${_k} --save "${WORK}/at-${_k}.ckpt")
  run("${REPLAY}" "${CASE}" --threads 1 --load "${WORK}/at-${_k}.ckpt" --out "${WORK}/load-${_k}")
  file(GLOB _state RELATIVE "${WORK}/full" "${WORK}/full/*.npy")
  list(REMOVE_ITEM _state params.npy)
  foreach(_f IN LISTS _state)
    file(SHA256 "${WORK}/full/${_f}" _ha)
    file(SHA256 "${WORK}/load-${_k}/${_f}" _hb)
    if(NOT _ha STREQUAL _hb)
      message(FATAL_ERROR "state ${_f} after --load of a checkpoint at step ${_k} differs from the uninterrupted run's")
    endif()
  endforeach()
endforeach()
message(STATUS "resumed at steps ${_ks}: identical to the uninterrupted run")
