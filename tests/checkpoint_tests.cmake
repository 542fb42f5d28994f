# Checkpoint tests beyond the unit suite; include()d from tests/CMakeLists.txt.
#
#   checkpoint.resume.<case>   every golden case resumed at steps 0, 1, N/2,
#                              N-1 and N, in one process (--resume-at) and in
#                              two (--stop-after --save, --load): outputs equal
#                              an uninterrupted run's bit for bit (the external
#                              folder's cases: checkpoint.resume-external.<case>)
#   checkpoint.bad.<damage>    corrupt, truncated, wrong-version, foreign and
#                              wrong-case checkpoints: skewadam-replay --load
#                              exits with 1 or 2 and says why, never a signal
#   large.huge_tensor          a bf16 expert tensor of more than 2^31 elements,
#                              under every CPU kernel architecture level, in
#                              one process (label "large": about 9 GB of
#                              memory)
#
# The golden cases are those of golden_cases.cmake.

if(NOT TARGET doctest::doctest)
  find_package(doctest REQUIRED)
endif()

set(_ckpt_src ${CMAKE_CURRENT_LIST_DIR}/checkpoint)
set(_ckpt_work ${CMAKE_CURRENT_BINARY_DIR}/checkpoint)

add_executable(skewadam-ckpt-mangle ${_ckpt_src}/mangle.cpp)
target_link_libraries(skewadam-ckpt-mangle PRIVATE skewadam::skewadam)
skewadam_test_program(skewadam-ckpt-mangle)
if(TARGET skewadam_warnings)
  target_link_libraries(skewadam-ckpt-mangle PRIVATE skewadam_warnings)
endif()

# ------------------------------------------------------------ golden cases
foreach(_set IN LISTS SKEWADAM_GOLDEN_SETS)
  set(_resume resume)
  if(NOT _set STREQUAL "golden")
    set(_resume resume-external)
  endif()
  foreach(_case IN LISTS SKEWADAM_GOLDEN_CASES_${_set})
    get_filename_component(_name "${_case}" NAME)
    add_test(NAME checkpoint.${_resume}.${_name}
             COMMAND ${CMAKE_COMMAND} -DREPLAY=$<TARGET_FILE:skewadam-replay> -DCASE=${_case}
                     -DWORK=${_ckpt_work}/${_resume}/${_name} -P ${_ckpt_src}/resume_case.cmake)
    set_tests_properties(checkpoint.${_resume}.${_name} PROPERTIES LABELS checkpoint)
  endforeach()
endforeach()

# ---------------------------------------------------------- bad checkpoints
# Damaged checkpoints of the backbone case (fp32, momentum + factored), and one
# saved from another case.
set(_base_case ${SKEWADAM_GOLDEN_DIR_golden}/backbone_2d)
set(_other_case ${SKEWADAM_GOLDEN_DIR_golden}/bank3d_matrix_clip)
foreach(_c IN ITEMS ${_base_case} ${_other_case})
  if(NOT EXISTS ${_c}/case.json)
    message(FATAL_ERROR "checkpoint tests: ${_c} is missing (reference/generate.py writes it)")
  endif()
endforeach()
set(_base ${_ckpt_work}/bad/base.ckpt)
file(MAKE_DIRECTORY ${_ckpt_work}/bad)
add_test(NAME checkpoint.bad.setup
         COMMAND skewadam-replay ${_base_case} --stop-after 1 --save ${_base})
set_tests_properties(checkpoint.bad.setup PROPERTIES FIXTURES_SETUP skewadam_bad_checkpoint LABELS checkpoint)

# damage | what the message must say
set(_damages
  "truncate:0|empty file, not a checkpoint"
  "truncate:11|not a skewadam checkpoint"
  "truncate:20|truncated inside the file header"
  "truncate:50%|truncated: [0-9]+ bytes, the header says"
  "truncate:-1|truncated: [0-9]+ bytes, the header says"
  "flip:5|not a skewadam checkpoint \\(unknown signature\\)"
  "flip:13|file header checksum mismatch"
  "flip:40|checksum mismatch in the optimizer record"
  "flip:50%|checksum mismatch in the .* record"
  "flip:-2|checksum mismatch in the end record"
  "version:4|checkpoint format version 4. this build reads versions 1 to 3"
  "version:0|checkpoint format version 0"
  "append:1|1 byte after the end"
  "random:4096|not a skewadam checkpoint"
  "empty|empty file"
  "text|not a skewadam checkpoint"
  "npy|not a skewadam checkpoint"
  "directory|is a directory"
  "missing|no such file"
  "other-case|saved from case")
foreach(_d IN LISTS _damages)
  string(FIND "${_d}" "|" _bar)
  string(SUBSTRING "${_d}" 0 ${_bar} _damage)
  math(EXPR _bar "${_bar} + 1")
  string(SUBSTRING "${_d}" ${_bar} -1 _expect)
  string(MAKE_C_IDENTIFIER "${_damage}" _id)
  add_test(NAME checkpoint.bad.${_id}
           COMMAND ${CMAKE_COMMAND} -DREPLAY=$<TARGET_FILE:skewadam-replay>
                   -DMANGLE=$<TARGET_FILE:skewadam-ckpt-mangle> -DCASE=${_base_case}
                   -DOTHER_CASE=${_other_case} -DBASE=${_base} -DWORK=${_ckpt_work}/bad
                   -DDAMAGE=${_damage} -DEXPECT=${_expect} -P ${_ckpt_src}/bad_checkpoint.cmake)
  set_tests_properties(checkpoint.bad.${_id} PROPERTIES FIXTURES_REQUIRED skewadam_bad_checkpoint
                       LABELS checkpoint)
endforeach()

# ------------------------------------------------------------- large tensor
# (the full tier: about 10 GB of memory and a minute per level)
if(NOT SKEWADAM_FULL_TESTS)
  return()
endif()
add_executable(skewadam-large-tests ${CMAKE_CURRENT_LIST_DIR}/large/test_huge_tensor.cpp)
target_link_libraries(skewadam-large-tests PRIVATE skewadam::skewadam doctest::doctest)
skewadam_test_program(skewadam-large-tests)
# its own loops (the parameter, the gradients and the reference, 2^31
# elements each) optimized as a user's build would
target_compile_options(skewadam-large-tests PRIVATE
                       $<$<AND:$<CXX_COMPILER_ID:GNU,Clang>,$<CONFIG:Release,RelWithDebInfo>>:-O2>)
if(TARGET skewadam_warnings)
  target_link_libraries(skewadam-large-tests PRIVATE skewadam_warnings)
endif()
# Every CPU kernel architecture level this build and processor run, in one
# process: the reference, the parameter and the gradients are computed once
# for all of them.
add_test(NAME large.huge_tensor COMMAND skewadam-large-tests)
set_tests_properties(large.huge_tensor PROPERTIES LABELS "large;full" TIMEOUT 1800 RUN_SERIAL TRUE)
