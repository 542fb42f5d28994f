# The code examples of the README and the guide (docs/*.md), each extracted
# and built as a user builds it. An example sits between
#
#   <!-- example:begin NAME KIND -->
#   ```cpp (or ```python)
#   ...
#   ```
#   <!-- example:end -->
#
# and KIND says what it needs and how it is checked:
#   cpp         the library alone: built and run (it returns 0 when what it
#               shows holds)
#   mpi         the sharded optimizer over MPI: built and run at 2 ranks,
#               where MPI was found
#   torch       the LibTorch adapter: built and run, where LibTorch was found
#   python      the Python package: run by the venv's interpreter, where the
#               package is built (SKEWADAM_WITH_PYTHON)
#   cuda        the CUDA backend: built by nvcc (SKEWADAM_WITH_CUDA; the
#               target skewadam-doc-cuda-examples builds them all), not run
#               (it returns 0 where no GPU is)
#   torch-cuda  a CUDA LibTorch's engines: compiled against torch's CUDA
#               headers (SKEWADAM_TORCH_HEADERS), never linked here
# A page with a malformed example, or a kind not in this list, stops the
# configure.

set(_doc_example_kinds cpp mpi torch python cuda torch-cuda)
file(GLOB _doc_pages CONFIGURE_DEPENDS ${PROJECT_SOURCE_DIR}/docs/*.md)
list(PREPEND _doc_pages ${PROJECT_SOURCE_DIR}/README.md)
set(_doc_example_dir ${CMAKE_CURRENT_BINARY_DIR}/doc_examples)
set(_doc_example_names "")
set(_doc_cuda_targets "")
foreach(_page IN LISTS _doc_pages)
  set_property(DIRECTORY APPEND PROPERTY CMAKE_CONFIGURE_DEPENDS ${_page})
  file(RELATIVE_PATH _page_name ${PROJECT_SOURCE_DIR} ${_page})
  file(READ ${_page} _text)
  while(TRUE)
    string(FIND "${_text}" "<!-- example:begin " _at)
    if(_at EQUAL -1)
      break()
    endif()
    string(SUBSTRING "${_text}" ${_at} -1 _text)
    string(FIND "${_text}" "<!-- example:end -->" _end)
    if(_end EQUAL -1)
      message(FATAL_ERROR "${_page_name}: an example begins and never ends (<!-- example:end -->)")
    endif()
    string(SUBSTRING "${_text}" 0 ${_end} _block)
    math(EXPR _past "${_end} + 20")
    string(SUBSTRING "${_text}" ${_past} -1 _text)
    if(NOT _block MATCHES "^<!-- example:begin ([a-z0-9-]+) ([a-z-]+) -->")
      message(FATAL_ERROR "${_page_name}: an example's first line is not <!-- example:begin NAME KIND -->")
    endif()
    set(_name ${CMAKE_MATCH_1})
    set(_kind ${CMAKE_MATCH_2})
    if(NOT _kind IN_LIST _doc_example_kinds)
      message(FATAL_ERROR "${_page_name}: example ${_name}: kind '${_kind}' is none of ${_doc_example_kinds}")
    endif()
    if(_name IN_LIST _doc_example_names)
      message(FATAL_ERROR "${_page_name}: a second example named ${_name}")
    endif()
    list(APPEND _doc_example_names ${_name})
    if(NOT _block MATCHES "```[a-z]+\n(.*)```")
      message(FATAL_ERROR "${_page_name}: example ${_name} holds no fenced code block")
    endif()
    set(_code "${CMAKE_MATCH_1}")
    set(_test doc-examples/${_page_name}/${_name})
    if(_kind STREQUAL "python")
      set(_file ${_doc_example_dir}/${_name}.py)
      file(CONFIGURE OUTPUT ${_file} CONTENT "# Extracted from ${_page_name} by tests/doc_examples.cmake.\n${_code}")
      if(SKEWADAM_WITH_PYTHON)
        add_test(NAME ${_test} COMMAND ${SKEWADAM_PYTHON_VENV}/bin/python ${_file})
        set_tests_properties(${_test} PROPERTIES LABELS python)
      endif()
      continue()
    endif()
    set(_ext cpp)
    if(_kind MATCHES "cuda")
      set(_ext cu)
    endif()
    set(_file ${_doc_example_dir}/${_name}.${_ext})
    file(CONFIGURE OUTPUT ${_file} CONTENT "// Extracted from ${_page_name} by tests/doc_examples.cmake.\n${_code}")
    set(_target skewadam-doc-${_name})
    if(_kind STREQUAL "cpp")
      add_executable(${_target} ${_file})
      target_link_libraries(${_target} PRIVATE skewadam::skewadam skewadam_warnings)
      add_test(NAME ${_test} COMMAND ${_target})
    elseif(_kind STREQUAL "mpi" AND SKEWADAM_MPI_ENABLED)
      add_executable(${_target} ${_file})
      target_link_libraries(${_target} PRIVATE skewadam::skewadam skewadam_warnings MPI::MPI_CXX)
      skewadam_add_mpi_test(${_test} 2 $<TARGET_FILE:${_target}>)
    elseif(_kind STREQUAL "torch" AND SKEWADAM_WITH_TORCH)
      add_executable(${_target} ${_file})
      target_link_libraries(${_target} PRIVATE skewadam::skewadam ${TORCH_LIBRARIES})
      add_test(NAME ${_test} COMMAND ${_target})
      set_tests_properties(${_test} PROPERTIES LABELS torch)
    elseif(_kind STREQUAL "cuda" AND SKEWADAM_WITH_CUDA)
      add_executable(${_target} ${_file})
      target_link_libraries(${_target} PRIVATE skewadam::cuda)
      list(APPEND _doc_cuda_targets ${_target})
    elseif(_kind STREQUAL "torch-cuda" AND TARGET skewadam-torch-headers-cuda)
      target_sources(skewadam-torch-headers-cuda PRIVATE ${_file})
    endif()
  endwhile()
endforeach()
if(SKEWADAM_WITH_CUDA)
  add_custom_target(skewadam-doc-cuda-examples DEPENDS ${_doc_cuda_targets})
endif()
if(NOT _doc_example_names)
  message(FATAL_ERROR "README.md, docs/: no code example found: the examples are not tested")
endif()
