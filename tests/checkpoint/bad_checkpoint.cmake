# cmake -DREPLAY=... -DMANGLE=... -DCASE=dir -DBASE=file -DWORK=dir -DDAMAGE=op -DEXPECT=regex
#       [-DOTHER_CASE=dir] -P bad_checkpoint.cmake
#
# Makes a bad checkpoint and checks that `skewadam-replay CASE --load` rejects
# it with exit status 1 or 2 (never a signal or an abort) and a message
# matching EXPECT. DAMAGE is a skewadam-ckpt-mangle operation applied to BASE,
# or one of: empty, text, npy (a foreign file), directory, missing, other-case
# (BASE loaded into OTHER_CASE).
cmake_minimum_required(VERSION 3.25)
foreach(_v REPLAY MANGLE CASE BASE WORK DAMAGE EXPECT)
  if(NOT DEFINED ${_v})
    message(FATAL_ERROR "bad_checkpoint.cmake: -D${_v}= is required")
  endif()
endforeach()

string(MAKE_C_IDENTIFIER "${DAMAGE}" _name)
set(_file "${WORK}/bad-${_name}.ckpt")
file(MAKE_DIRECTORY "${WORK}")
file(REMOVE_RECURSE "${_file}")
set(_case "${CASE}")
if(DAMAGE STREQUAL "empty")
  file(WRITE "${_file}" "")
elseif(DAMAGE STREQUAL "text")
  file(WRITE "${_file}" "step: 12\nlr: 0.001\n")
elseif(DAMAGE STREQUAL "npy")
  file(COPY_FILE "${CASE}/param0.npy" "${_file}")
elseif(DAMAGE STREQUAL "directory")
  file(MAKE_DIRECTORY "${_file}")
elseif(DAMAGE STREQUAL "missing")
elseif(DAMAGE STREQUAL "other-case")
  file(COPY_FILE "${BASE}" "${_file}")
  set(_case "${OTHER_CASE}")
else()
  execute_process(COMMAND "${MANGLE}" "${BASE}" "${_file}" "${DAMAGE}" RESULT_VARIABLE _rc ERROR_VARIABLE _err)
  if(NOT _rc STREQUAL "0")
    message(FATAL_ERROR "skewadam-ckpt-mangle ${DAMAGE} failed (${_rc}): ${_err}")
  endif()
endif()

execute_process(COMMAND "${REPLAY}" "${_case}" --load "${_file}"
                RESULT_VARIABLE _rc OUTPUT_VARIABLE _out ERROR_VARIABLE _err)
if(NOT (_rc STREQUAL "1" OR _rc STREQUAL "2"))
  message(FATAL_ERROR "expected exit status 1 or 2, got '${_rc}'\n${_out}${_err}")
endif()
if(NOT _err MATCHES "${EXPECT}")
  message(FATAL_ERROR "the message does not match '${EXPECT}':\n${_err}")
endif()
message(STATUS "rejected with ${_rc}: ${_err}")
