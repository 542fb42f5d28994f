# SKEWADAM_WITH_TORCH: the LibTorch half (the adapter's tests, the moe_lm
# demo). With SKEWADAM_TORCH_OPTIONAL, torch's CMake package is first found in
# a child configure (cmake/torch_probe): if it fails there (a fatal error in
# torch's own CMake files, a toolkit it does not accept), the torch half is
# skipped, SKEWADAM_TORCH_SKIPPED says why (in the cache, for scripts such as
# scripts/gpu-check), and everything else configures and builds as without
# torch. Without SKEWADAM_TORCH_OPTIONAL a failing torch package fails the
# configure, as it always has.
option(SKEWADAM_TORCH_OPTIONAL "With SKEWADAM_WITH_TORCH: skip the torch half, instead of failing, when torch's CMake package fails" OFF)
set(SKEWADAM_TORCH_SKIPPED "" CACHE INTERNAL "why the torch half was skipped (SKEWADAM_TORCH_OPTIONAL)")
if(SKEWADAM_WITH_TORCH AND SKEWADAM_TORCH_OPTIONAL)
  set(_probe_dir ${CMAKE_BINARY_DIR}/torch-probe)
  file(REMOVE_RECURSE ${_probe_dir})
  # (the prefix path through the environment, ':'-separated: a ';' list
  # would be split into separate arguments of the command)
  string(REPLACE ";" ":" _prefix "${CMAKE_PREFIX_PATH}")
  set(_probe_args -E env "CMAKE_PREFIX_PATH=${_prefix}" ${CMAKE_COMMAND}
      -S ${CMAKE_CURRENT_LIST_DIR}/torch_probe -B ${_probe_dir} -G ${CMAKE_GENERATOR}
      -DCMAKE_CXX_COMPILER=${CMAKE_CXX_COMPILER})
  foreach(_var Torch_DIR CMAKE_CUDA_COMPILER CMAKE_CUDA_ARCHITECTURES CMAKE_MAKE_PROGRAM)
    if(DEFINED ${_var})
      string(REPLACE ";" "\\;" _value "${${_var}}")
      list(APPEND _probe_args "-D${_var}=${_value}")
    endif()
  endforeach()
  if(SKEWADAM_WITH_CUDA)
    list(APPEND _probe_args -DSKEWADAM_PROBE_CUDA=ON)
  endif()
  execute_process(COMMAND ${CMAKE_COMMAND} ${_probe_args} RESULT_VARIABLE _probe_rc OUTPUT_VARIABLE _probe_out
                  ERROR_VARIABLE _probe_out)
  file(WRITE ${_probe_dir}/probe.log "${_probe_out}")
  if(NOT _probe_rc EQUAL 0)
    # the first error torch's package reported, on one line: what follows
    # "CMake Error at FILE:LINE (...):", up to its call stack or a blank line
    set(_why "")
    string(FIND "${_probe_out}" "CMake Error" _at)
    if(_at GREATER_EQUAL 0)
      string(SUBSTRING "${_probe_out}" ${_at} -1 _why)
      string(FIND "${_why}" "\n" _eol)
      if(_eol GREATER_EQUAL 0)
        math(EXPR _eol "${_eol} + 1")
        string(SUBSTRING "${_why}" ${_eol} -1 _why)
      endif()
      foreach(_end "Call Stack" "\n\n")
        string(FIND "${_why}" "${_end}" _cut)
        if(_cut GREATER_EQUAL 0)
          string(SUBSTRING "${_why}" 0 ${_cut} _why)
        endif()
      endforeach()
      string(REGEX REPLACE "[ \n]+" " " _why "${_why}")
      string(STRIP "${_why}" _why)
    endif()
    if(_why STREQUAL "")
      set(_why "torch's CMake package failed (exit ${_probe_rc})")
    endif()
    set(SKEWADAM_TORCH_SKIPPED "${_why} (${_probe_dir}/probe.log)" CACHE INTERNAL "")
    message(WARNING "The torch half is skipped: ${_why}. Its log: ${_probe_dir}/probe.log")
    set(SKEWADAM_WITH_TORCH OFF)
  endif()
endif()
