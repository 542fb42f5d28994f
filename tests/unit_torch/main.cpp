// The LibTorch adapter's tests: a separate executable, built only when
// LibTorch is found (tests/torch_tests.cmake).
#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
#include <doctest/doctest.h>
