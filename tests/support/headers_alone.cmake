# ctest driver: compiles every public header of include/skewadam alone, in a
# fresh project made here each run (so that nothing was built before): one
# source per header that includes it twice (its include guard tested too),
# built with -j2 and the flags a user's build gets plus the project's
# warnings as errors. The CUDA backend's and LibTorch's headers need nvcc or
# LibTorch (their own builds compile them); the MPI communicator's runs where
# MPI was found; skewadam/engine/backend/cpu/compiled.hpp with the compiled mode's definition.
#   cmake -DCXX=... -DGENERATOR=... -DSOURCE_DIR=... -DWORK_DIR=... -DFLAGS=a;b -DINCLUDES=a;b -DMPI=ON|OFF
#         -P headers_alone.cmake
file(REMOVE_RECURSE ${WORK_DIR})
file(GLOB_RECURSE _headers RELATIVE ${SOURCE_DIR}/include ${SOURCE_DIR}/include/skewadam/*.hpp)
list(SORT _headers)
set(_sources "")
set(_count 0)
foreach(_h IN LISTS _headers)
  if(_h MATCHES "/torch/|/cuda/|/nccl/" OR (_h MATCHES "/mpi/" AND NOT MPI))
    continue()
  endif()
  string(MAKE_C_IDENTIFIER "${_h}" _id)
  set(_define "")
  if(_h STREQUAL "skewadam/engine/backend/cpu/compiled.hpp")
    set(_define "#define SKEWADAM_COMPILED\n")
  endif()
  file(WRITE ${WORK_DIR}/src/${_id}.cpp "${_define}#include <${_h}>\n#include <${_h}>\n")
  string(APPEND _sources " ${_id}.cpp")
  math(EXPR _count "${_count} + 1")
endforeach()
if(_count LESS 50)
  message(FATAL_ERROR "only ${_count} headers found under ${SOURCE_DIR}/include: the list of headers is wrong")
endif()
string(REPLACE ";" " " _flags "${FLAGS}")
string(REPLACE ";" " " _includes "${INCLUDES}")
file(WRITE ${WORK_DIR}/src/CMakeLists.txt
  "cmake_minimum_required(VERSION 3.25)\nproject(headers_alone CXX)\n"
  "add_library(headers OBJECT${_sources})\n"
  "target_include_directories(headers PRIVATE ${_includes})\n"
  "separate_arguments(_flags UNIX_COMMAND \"${_flags}\")\n"
  "target_compile_options(headers PRIVATE \${_flags})\n")
execute_process(COMMAND ${CMAKE_COMMAND} -S ${WORK_DIR}/src -B ${WORK_DIR}/build -G ${GENERATOR}
                        -DCMAKE_CXX_COMPILER=${CXX} RESULT_VARIABLE _rc OUTPUT_VARIABLE _out ERROR_VARIABLE _err)
if(NOT _rc EQUAL 0)
  message(FATAL_ERROR "configuring the headers' project failed:\n${_out}\n${_err}")
endif()
set(_keep_going -k)  # every failing header, not the first
if(GENERATOR MATCHES "Ninja")
  set(_keep_going -k 0)
endif()
execute_process(COMMAND ${CMAKE_COMMAND} --build ${WORK_DIR}/build -j 2 -- ${_keep_going}
                RESULT_VARIABLE _rc OUTPUT_VARIABLE _out ERROR_VARIABLE _err)
if(NOT _rc EQUAL 0)
  message(FATAL_ERROR "headers that do not compile alone (the failed sources name them):\n${_out}\n${_err}")
endif()
message(STATUS "${_count} headers compile alone")
