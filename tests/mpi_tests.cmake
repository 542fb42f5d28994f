# Sharded optimizer over MPI (SKEWADAM_WITH_MPI): every golden case at 2 and 3
# ranks (an even and an uneven cut), a few at 1 and 4 ranks too, checked by
# skewadam-replay and by the independent checker (and at 2 and 3 ranks on
# the CUDA backend emulated on the host);
# expert banks sharded by rows too; checkpoints saved with 2 ranks resumed
# with 3 and in one process; the sharded optimizer against the single-process
# one on a mixed model.
#
# More ranks than cores (CI has 2) need Open MPI's --oversubscribe; as root it
# also needs --allow-run-as-root. Ranks on one machine talk through shared
# memory; the single-copy mechanism (CMA) is off, as containers often forbid it.

set(_mpiexec ${MPIEXEC_EXECUTABLE})
set(_mpi_flags ${MPIEXEC_PREFLAGS})
execute_process(COMMAND ${MPIEXEC_EXECUTABLE} --version OUTPUT_VARIABLE _mpi_version ERROR_QUIET)
if(_mpi_version MATCHES "Open MPI|OpenRTE")
  list(APPEND _mpi_flags --allow-run-as-root --oversubscribe)
  set(_mpi_env OMPI_MCA_btl_vader_single_copy_mechanism=none OMPI_MCA_rmaps_base_oversubscribe=1)
else()
  set(_mpi_env "")
endif()

# add_mpi_test(NAME RANKS COMMAND...)
function(skewadam_add_mpi_test name ranks)
  add_test(NAME ${name} COMMAND ${_mpiexec} ${MPIEXEC_NUMPROC_FLAG} ${ranks} ${_mpi_flags} ${ARGN})
  set(_procs ${ranks})
  if(_procs GREATER 2)
    set(_procs 2)
  endif()
  set_tests_properties(${name} PROPERTIES PROCESSORS ${_procs} TIMEOUT 120 LABELS mpi ENVIRONMENT "${_mpi_env}")
endfunction()

# Each set's cases (golden_cases.cmake): golden-mpi/<case>/..., and
# golden-external-mpi/<case>/... for the external folder's.
# The cases also run at 1 and 4 ranks: a backbone matrix cut by rows, an
# expert bank, a router, rank-1 and rank-4 tensors and momentum stored in blocks (the
# contract suite runs every path at one rank over the self communicator).
set(_every_rank_count backbone_2d bank3d_tensor_clip router_2d bias_1d_fallback momentum_float8_bank3d
    momentum_bf16_2d rank4_factored)
# The fast tier runs its representative cases (SKEWADAM_FAST_MPI_CASES) at
# 3 ranks alone, on the CPU and the emulated CUDA backend.
foreach(_set IN LISTS SKEWADAM_GOLDEN_SETS)
  foreach(_case IN LISTS SKEWADAM_GOLDEN_CASES_${_set})
    get_filename_component(_name ${_case} NAME)
    skewadam_in_tier(${_set} ${_name} SKEWADAM_FAST_MPI_CASES _sharded)
    if(NOT _sharded)
      continue()
    endif()
    set(_rank_counts 2 3)
    if(_name IN_LIST _every_rank_count OR NOT _set STREQUAL "golden")
      set(_rank_counts 1 2 3 4)
    endif()
    if(NOT SKEWADAM_FULL_TESTS)
      set(_rank_counts 3)
    endif()
    # (what the fast tier also runs: the representative cases at 3 ranks)
    set(_fast_case OFF)
    if(_set STREQUAL "golden" AND _name IN_LIST SKEWADAM_FAST_MPI_CASES)
      set(_fast_case ON)
    endif()
    foreach(_ranks IN LISTS _rank_counts)
      set(_out ${CMAKE_CURRENT_BINARY_DIR}/golden-mpi-out/${_set}/${_name}-n${_ranks})
      skewadam_add_mpi_test(${_set}-mpi/${_name}/ranks-${_ranks} ${_ranks}
                            $<TARGET_FILE:skewadam-replay> ${_case} --shard --out ${_out})
      add_test(NAME ${_set}-mpi/${_name}/ranks-${_ranks}/independent-check
               COMMAND ${SKEWADAM_PYTHON} ${CMAKE_CURRENT_SOURCE_DIR}/check_golden.py ${_case} ${_out})
      set_tests_properties(${_set}-mpi/${_name}/ranks-${_ranks}/independent-check PROPERTIES
                           DEPENDS ${_set}-mpi/${_name}/ranks-${_ranks} LABELS mpi)
      if(NOT (_fast_case AND _ranks EQUAL 3))
        skewadam_full_only(${_set}-mpi/${_name}/ranks-${_ranks} ${_set}-mpi/${_name}/ranks-${_ranks}/independent-check)
      endif()
    endforeach()
    # The sharded placement over the CUDA backend (engine/backend/cuda/cuda_backend.hpp),
    # its kernels emulated on the host: at 2 and 3 ranks (rows cut between
    # ranks; whole experts).
    foreach(_ranks 2 3)
      if(SKEWADAM_REPLAY_CUDA_EMULATED AND (SKEWADAM_FULL_TESTS OR _ranks EQUAL 3))
        skewadam_add_mpi_test(${_set}-mpi/${_name}/ranks-${_ranks}/cuda-emulated ${_ranks}
                              $<TARGET_FILE:skewadam-replay> ${_case} --shard --backend cuda-emulated)
        if(NOT (_fast_case AND _ranks EQUAL 3))
          skewadam_full_only(${_set}-mpi/${_name}/ranks-${_ranks}/cuda-emulated)
        endif()
      endif()
    endforeach()
  endforeach()
endforeach()

# Expert banks [E, r, c] of the project's cases sharded by rows instead of
# whole experts, on the CPU and on the emulated CUDA backend.
set(_golden ${SKEWADAM_GOLDEN_DIR_golden})
set(_expert_rows bank3d_tensor_clip bank3d_matrix_clip uniform_3d bf16_experts_bank)
set(_expert_rows_emulated bank3d_tensor_clip uniform_3d bf16_experts_bank)
set(_checkpointed backbone_2d bank3d_tensor_clip router_2d bf16_backbone_2d)
# (the fast tier's: one bank by rows, two checkpointed cases)
set(_fast_expert_rows bank3d_tensor_clip)
set(_fast_checkpointed bank3d_tensor_clip backbone_2d)
if(NOT SKEWADAM_FULL_TESTS)
  set(_expert_rows ${_fast_expert_rows})
  set(_expert_rows_emulated ${_fast_expert_rows})
  set(_checkpointed ${_fast_checkpointed})
endif()
foreach(_name IN LISTS _expert_rows)
  skewadam_add_mpi_test(golden-mpi/${_name}/ranks-3/expert-rows 3
                        $<TARGET_FILE:skewadam-replay> ${_golden}/${_name} --shard --expert-rows)
  if(NOT _name IN_LIST _fast_expert_rows)
    skewadam_full_only(golden-mpi/${_name}/ranks-3/expert-rows)
  endif()
endforeach()
if(NOT SKEWADAM_REPLAY_CUDA_EMULATED)
  set(_expert_rows_emulated "")
endif()
foreach(_name IN LISTS _expert_rows_emulated)
  skewadam_add_mpi_test(golden-mpi/${_name}/ranks-3/expert-rows/cuda-emulated 3
                        $<TARGET_FILE:skewadam-replay> ${_golden}/${_name} --shard --expert-rows
                        --backend cuda-emulated)
  if(NOT _name IN_LIST _fast_expert_rows)
    skewadam_full_only(golden-mpi/${_name}/ranks-3/expert-rows/cuda-emulated)
  endif()
endforeach()

# Checkpoints: saved by 2 ranks after step 12, resumed by 3 ranks (and, for a
# 2-D case, by one process without --shard); the resumed steps must match the
# golden ones.
set(_ckpt_dir ${CMAKE_CURRENT_BINARY_DIR}/mpi-checkpoints)
file(MAKE_DIRECTORY ${_ckpt_dir})
foreach(_name IN LISTS _checkpointed)
  set(_case ${_golden}/${_name})
  set(_file ${_ckpt_dir}/${_name}-n2.ckpt)
  skewadam_add_mpi_test(checkpoint-mpi/${_name}/save-2-ranks 2
                        $<TARGET_FILE:skewadam-replay> ${_case} --shard --stop-after 12 --save ${_file})
  set_tests_properties(checkpoint-mpi/${_name}/save-2-ranks PROPERTIES FIXTURES_SETUP ckpt-mpi-${_name})
  skewadam_add_mpi_test(checkpoint-mpi/${_name}/resume-3-ranks 3
                        $<TARGET_FILE:skewadam-replay> ${_case} --shard --load ${_file}
                        --out ${_ckpt_dir}/${_name}-resumed)
  set_tests_properties(checkpoint-mpi/${_name}/resume-3-ranks PROPERTIES FIXTURES_REQUIRED ckpt-mpi-${_name}
                       PASS_REGULAR_EXPRESSION "steps 13\\.\\.30, loaded .*PASS")
  # the CUDA backend's sharded engine resumes the CPU's sharded checkpoint
  if(SKEWADAM_REPLAY_CUDA_EMULATED)
    skewadam_add_mpi_test(checkpoint-mpi/${_name}/resume-3-ranks/cuda-emulated 3
                          $<TARGET_FILE:skewadam-replay> ${_case} --shard --backend cuda-emulated --load ${_file})
    set_tests_properties(checkpoint-mpi/${_name}/resume-3-ranks/cuda-emulated PROPERTIES
                         FIXTURES_REQUIRED ckpt-mpi-${_name} PASS_REGULAR_EXPRESSION "steps 13\\.\\.30, loaded .*PASS")
  endif()
  if(NOT _name MATCHES "bank")
    add_test(NAME checkpoint-mpi/${_name}/resume-1-process
             COMMAND skewadam-replay ${_case} --load ${_file})
    set_tests_properties(checkpoint-mpi/${_name}/resume-1-process PROPERTIES FIXTURES_REQUIRED ckpt-mpi-${_name}
                         LABELS mpi PASS_REGULAR_EXPRESSION "loaded .*steps 13\\.\\.30.*PASS")
  endif()
  if(NOT _name IN_LIST _fast_checkpointed)
    get_property(_tests DIRECTORY PROPERTY TESTS)
    list(FILTER _tests INCLUDE REGEX "^checkpoint-mpi/${_name}/")
    skewadam_full_only(${_tests})
  endif()
endforeach()

# The sharded optimizer against the single-process one, on a mixed model.
add_executable(skewadam-mpi-tests ${CMAKE_CURRENT_SOURCE_DIR}/mpi/test_sharded_mpi.cpp)
target_link_libraries(skewadam-mpi-tests PRIVATE skewadam::skewadam skewadam_tooling skewadam_warnings MPI::MPI_CXX)
skewadam_test_program(skewadam-mpi-tests)
set(_unit_ranks 2 3 4)
set(_unit_ranks_emulated 2 3)
if(NOT SKEWADAM_FULL_TESTS)
  set(_unit_ranks 3)
  set(_unit_ranks_emulated 3)
endif()
foreach(_ranks IN LISTS _unit_ranks)
  skewadam_add_mpi_test(unit-mpi/sharded-vs-single/ranks-${_ranks} ${_ranks} $<TARGET_FILE:skewadam-mpi-tests>)
  if(NOT _ranks EQUAL 3)
    skewadam_full_only(unit-mpi/sharded-vs-single/ranks-${_ranks})
  endif()
endforeach()
foreach(_ranks IN LISTS _unit_ranks_emulated)
  skewadam_add_mpi_test(unit-mpi/sharded-vs-single/ranks-${_ranks}/cuda-emulated ${_ranks}
                        $<TARGET_FILE:skewadam-mpi-tests> --backend cuda-emulated)
  if(NOT _ranks EQUAL 3)
    skewadam_full_only(unit-mpi/sharded-vs-single/ranks-${_ranks}/cuda-emulated)
  endif()
endforeach()

# ... and on the GPU, the ranks sharing it (a CUDA build; skipped without a device).
if(TARGET skewadam-sharded-gpu-tests)
  foreach(_ranks 2 3)
    skewadam_add_mpi_test(cuda/sharded/mpi-${_ranks}-ranks ${_ranks} $<TARGET_FILE:skewadam-sharded-gpu-tests> --comm mpi)
    set_tests_properties(cuda/sharded/mpi-${_ranks}-ranks PROPERTIES SKIP_RETURN_CODE 77 LABELS cuda RESOURCE_LOCK gpu)
  endforeach()
endif()

# The example trains across 2 processes and its loss goes down.
if(TARGET sharded_training)
  skewadam_add_mpi_test(examples/sharded_training 2 $<TARGET_FILE:sharded_training> --steps 300)
  skewadam_full_only(examples/sharded_training)
endif()
