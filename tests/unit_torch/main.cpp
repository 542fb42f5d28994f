// The LibTorch adapter's tests: a separate executable, built only when
// LibTorch is found (tests/torch_tests.cmake). The adapter header comes first,
// twice: it compiles alone and is idempotent.
#include <skewadam/torch/optimizer.hpp>
#include <skewadam/torch/optimizer.hpp>

#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
#include <doctest/doctest.h>
