# The golden conformance cases the tests run (docs/conformance.md): the
# project's own, tests/golden, and the cases of an external folder named by
# SKEWADAM_GOLDEN_DIR, run in addition under test names of their own.
# Defines
#   SKEWADAM_GOLDEN_SETS               golden, then golden-external when given
#   SKEWADAM_GOLDEN_DIR_<set>          the set's folder
#   SKEWADAM_GOLDEN_CASES_<set>        its case folders (holding case.json), sorted
# A set without a case stops the configuration: no case is a fault, never a pass.

function(skewadam_golden_cases_in dir out)
  file(GLOB _entries LIST_DIRECTORIES true CONFIGURE_DEPENDS "${dir}/*")
  set(_cases "")
  foreach(_e IN LISTS _entries)
    if(IS_DIRECTORY "${_e}" AND EXISTS "${_e}/case.json")
      list(APPEND _cases "${_e}")
    endif()
  endforeach()
  list(SORT _cases)
  set(${out} "${_cases}" PARENT_SCOPE)
endfunction()

set(SKEWADAM_GOLDEN_SETS golden)
set(SKEWADAM_GOLDEN_DIR_golden ${PROJECT_SOURCE_DIR}/tests/golden)
skewadam_golden_cases_in(${SKEWADAM_GOLDEN_DIR_golden} SKEWADAM_GOLDEN_CASES_golden)
list(LENGTH SKEWADAM_GOLDEN_CASES_golden _n_golden)
if(_n_golden EQUAL 0)
  message(FATAL_ERROR "skewadam: no golden case in ${SKEWADAM_GOLDEN_DIR_golden} (a case is a folder holding "
                      "case.json; reference/generate.py writes them)")
endif()
set(_golden_summary "${_n_golden} golden cases in tests/golden")

if(NOT SKEWADAM_GOLDEN_DIR STREQUAL "")
  get_filename_component(_external "${SKEWADAM_GOLDEN_DIR}" ABSOLUTE BASE_DIR ${CMAKE_BINARY_DIR})
  if(NOT IS_DIRECTORY "${_external}")
    message(FATAL_ERROR "skewadam: SKEWADAM_GOLDEN_DIR=${SKEWADAM_GOLDEN_DIR}: no such folder")
  endif()
  skewadam_golden_cases_in(${_external} SKEWADAM_GOLDEN_CASES_golden-external)
  list(LENGTH SKEWADAM_GOLDEN_CASES_golden-external _n_external)
  if(_n_external EQUAL 0)
    message(FATAL_ERROR "skewadam: SKEWADAM_GOLDEN_DIR=${SKEWADAM_GOLDEN_DIR} holds no golden case (no folder "
                        "in it holds a case.json)")
  endif()
  list(APPEND SKEWADAM_GOLDEN_SETS golden-external)
  set(SKEWADAM_GOLDEN_DIR_golden-external ${_external})
  string(APPEND _golden_summary ", ${_n_external} in SKEWADAM_GOLDEN_DIR=${_external} (tests golden-external/...)")
else()
  string(APPEND _golden_summary "; no external folder (SKEWADAM_GOLDEN_DIR)")
endif()
message(STATUS "skewadam: ${_golden_summary}")

# The folders of the cases, for the test programs that read them at run time
# (support/golden_dirs.hpp).
function(skewadam_golden_definitions target)
  target_compile_definitions(${target} PRIVATE SKEWADAM_GOLDEN_CASES_DIR="${SKEWADAM_GOLDEN_DIR_golden}")
  if("golden-external" IN_LIST SKEWADAM_GOLDEN_SETS)
    target_compile_definitions(${target} PRIVATE
                               SKEWADAM_GOLDEN_EXTERNAL_DIR="${SKEWADAM_GOLDEN_DIR_golden-external}")
  endif()
endfunction()

# The test tiers (SKEWADAM_TEST_TIER, the top-level CMakeLists.txt). Every
# case runs in both through the cheap entries (the replay at 1 and 2 threads
# and on each CPU level, the emulated CUDA backend, their independent checks,
# the reference, Python). The costly entries (resumed runs on the emulated
# CUDA backend, MPI rank counts) run every case in the full tier and, in the
# fast one, the project's cases that cover each rule, dtype, momentum storage
# and shape kind once, listed here per entry.
set(SKEWADAM_FAST_RESUME_CASES backbone_2d momentum_float8_bank3d bf16_experts_bank router_2d)
set(SKEWADAM_FAST_MPI_CASES backbone_2d bank3d_tensor_clip momentum_float8_bank3d)
# skewadam_in_tier(SET CASE_NAME LIST OUT): OUT is true when the full tier
# runs, or the case is one of the project's and in LIST.
function(skewadam_in_tier set name list out)
  if(SKEWADAM_FULL_TESTS OR (set STREQUAL "golden" AND name IN_LIST ${list}))
    set(${out} TRUE PARENT_SCOPE)
  else()
    set(${out} FALSE PARENT_SCOPE)
  endif()
endfunction()
# skewadam_full_only(TEST...): tests that the fast tier does not register
# (label full: the full tier's own, which CI runs on the fast tier's build
# after the fast tier's tests, ctest -L full).
function(skewadam_full_only)
  if(ARGN)
    set_property(TEST ${ARGN} APPEND PROPERTY LABELS full)
  endif()
endfunction()
