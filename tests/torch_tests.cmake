# The LibTorch adapter's tests: a separate doctest executable, since it needs
# LibTorch. tests/CMakeLists.txt includes this file when LibTorch is found:
#
#   find_package(Torch QUIET)
#   if(Torch_FOUND)
#     include(torch_tests.cmake)
#   endif()
#
# The tests also build the demo's model (examples/moe_lm/model.hpp).

if(NOT TARGET doctest::doctest)
  find_package(doctest REQUIRED)
endif()

add_executable(skewadam-torch-tests
  ${CMAKE_CURRENT_LIST_DIR}/unit_torch/main.cpp
  ${CMAKE_CURRENT_LIST_DIR}/unit_torch/test_adapter.cpp
  ${CMAKE_CURRENT_LIST_DIR}/unit_torch/test_serialize.cpp
  ${CMAKE_CURRENT_LIST_DIR}/unit_torch/test_tier_rules.cpp
  ${CMAKE_CURRENT_LIST_DIR}/unit_torch/test_training.cpp)
target_include_directories(skewadam-torch-tests PRIVATE
  ${CMAKE_CURRENT_LIST_DIR}/unit_torch
  ${CMAKE_CURRENT_LIST_DIR}/../examples/moe_lm)
target_link_libraries(skewadam-torch-tests PRIVATE skewadam::skewadam ${TORCH_LIBRARIES} doctest::doctest)
target_compile_features(skewadam-torch-tests PRIVATE cxx_std_20)
if(TARGET skewadam_warnings)
  target_link_libraries(skewadam-torch-tests PRIVATE skewadam_warnings)
endif()

add_test(NAME torch-adapter COMMAND skewadam-torch-tests)
# Two threads whatever the machine: the results must not depend on it, and a
# shared CI runner must not be oversubscribed.
set_tests_properties(torch-adapter PROPERTIES LABELS "torch" ENVIRONMENT "OMP_NUM_THREADS=2")
