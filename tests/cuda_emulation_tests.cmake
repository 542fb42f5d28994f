# The CUDA backend on the host (tests/emulation/): the CUDA engine and its
# kernels over the emulated runtime, no GPU and no CUDA toolkit needed. The
# contract suite runs over it; the kernel tests add what only the kernels
# show (long rows' sums), and the rounding tests the CPU backend's 16-bit bits.
# SKEWADAM_CUDA_EMULATION_SUITE=OFF leaves this program out and keeps the
# golden cases below (scripts/sanitize address: AddressSanitizer follows the
# emulated runtime's fibers too slowly for it).
option(SKEWADAM_CUDA_EMULATION_SUITE "Build and run the emulated CUDA backend's own test program" ON)
if(SKEWADAM_CUDA_EMULATION_SUITE)
  add_executable(skewadam-cuda-emulation-tests emulation/test_cuda_kernels_emulated.cpp
                 emulation/test_contract_cuda_emulated.cpp emulation/test_device_steps_emulated.cpp
                 emulation/test_rounding_emulated.cpp emulation/test_schedules_emulated.cpp
                 emulation/test_streams_emulated.cpp emulation/test_stored_momentum_emulated.cpp
                 emulation/test_devices_emulated.cpp)
  target_link_libraries(skewadam-cuda-emulation-tests PRIVATE skewadam::skewadam skewadam_tooling skewadam_warnings
                        doctest::doctest)
  target_include_directories(skewadam-cuda-emulation-tests PRIVATE ${CMAKE_CURRENT_SOURCE_DIR}/support)
  skewadam_golden_definitions(skewadam-cuda-emulation-tests)
  skewadam_test_program(skewadam-cuda-emulation-tests)
  # The kernels they instantiate themselves run as the GPU runs them, without
  # contraction into fused multiply-adds (CUDA: -fmad=false), as
  # skewadam_tool_kernels compiles the emulated passes.
  target_compile_options(skewadam-cuda-emulation-tests PRIVATE $<$<CXX_COMPILER_ID:GNU,Clang>:-ffp-contract=off>)
  # (the kernels' source defines main(): it stays alone)
  skewadam_unity_tests(skewadam-cuda-emulation-tests 2)
  set_source_files_properties(emulation/test_cuda_kernels_emulated.cpp PROPERTIES SKIP_UNITY_BUILD_INCLUSION ON)
  # They run with the blocks of every launch shuffled and spread over two host
  # threads (cuda_emulation.hpp), so that a race between blocks fails them; the
  # golden cases below with the blocks shuffled on one thread, their resumed
  # runs in the serial order.
  # Both tiers run them all (every golden case through the contract suite at
  # three ranks included: about 50 s of one core).
  doctest_discover_tests(skewadam-cuda-emulation-tests TEST_PREFIX "cuda-emulation/"
                         PROPERTIES LABELS cuda-emulation ENVIRONMENT SKEWADAM_EMU_BLOCKS=concurrent:2)
endif()

# Every golden case (each set, golden_cases.cmake) through skewadam-replay
# --backend cuda-emulated, and resumed at steps 1 and N/2 (the CPU's
# checkpoint.resume tests resume every case at 0, 1, N/2, N-1 and N as
# well; what the backend adds is its import of the state, the same at every
# step).
foreach(_set IN LISTS SKEWADAM_GOLDEN_SETS)
  set(_resume resume)
  if(NOT _set STREQUAL "golden")
    set(_resume resume-external)
  endif()
  foreach(_case IN LISTS SKEWADAM_GOLDEN_CASES_${_set})
    get_filename_component(_name ${_case} NAME)
    set(_out ${CMAKE_CURRENT_BINARY_DIR}/golden-out/${_set}/${_name}-cuda-emulated)
    add_test(NAME ${_set}/${_name}/cuda-emulated COMMAND skewadam-replay ${_case} --backend cuda-emulated --out ${_out})
    add_test(NAME ${_set}/${_name}/cuda-emulated/independent-check
             COMMAND ${SKEWADAM_PYTHON} ${CMAKE_CURRENT_SOURCE_DIR}/check_golden.py ${_case} ${_out})
    set_tests_properties(${_set}/${_name}/cuda-emulated/independent-check PROPERTIES
                         DEPENDS ${_set}/${_name}/cuda-emulated)
    set_tests_properties(${_set}/${_name}/cuda-emulated PROPERTIES LABELS cuda-emulation
                         ENVIRONMENT SKEWADAM_EMU_BLOCKS=shuffled)
    # (four seconds each: the fast tier resumes its representative cases)
    skewadam_in_tier(${_set} ${_name} SKEWADAM_FAST_RESUME_CASES _resumed)
    if(_resumed)
      add_test(NAME cuda-emulation/${_resume}.${_name}
               COMMAND ${CMAKE_COMMAND} -DREPLAY=$<TARGET_FILE:skewadam-replay> -DCASE=${_case} -DBACKEND=cuda-emulated
                       -DWORK=${CMAKE_CURRENT_BINARY_DIR}/cuda-emulated-resume/${_set}/${_name} -DPOINTS=inner
                       -P ${CMAKE_CURRENT_SOURCE_DIR}/checkpoint/resume_case.cmake)
      set_tests_properties(cuda-emulation/${_resume}.${_name} PROPERTIES LABELS cuda-emulation)
      if(NOT (_set STREQUAL "golden" AND _name IN_LIST SKEWADAM_FAST_RESUME_CASES))
        skewadam_full_only(cuda-emulation/${_resume}.${_name})
      endif()
    endif()
  endforeach()
endforeach()
