# A LibTorch CMake package whose configure fails, as torch's own can (a
# toolkit it does not accept, a library it cannot find): for
# tests/configure/torch_optional.cmake.
message(FATAL_ERROR "broken on purpose: this torch package cannot be configured")
