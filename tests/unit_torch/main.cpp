// The LibTorch adapter's tests: a separate executable, built only when
// LibTorch is found (tests/torch_tests.cmake). The adapter header comes first,
// twice: it compiles alone and is idempotent. On CUDA tensors
// (skewadam-torch-cuda-tests), a machine without a GPU skips them (exit 77).
#include <skewadam/torch/optimizer.hpp>
#include <skewadam/torch/optimizer.hpp>

#define DOCTEST_CONFIG_IMPLEMENT
#include "doctest_torch.hpp"

#include <torch/cuda.h>

#include <iostream>

int main(int argc, char** argv) {
#if defined(SKEWADAM_TORCH_TEST_CUDA)
  if (!torch::cuda::is_available()) {
    std::cout << "no CUDA device: the adapter's tests on CUDA tensors are skipped\n";
    return 77;
  }
#endif
  doctest::Context context(argc, argv);
  return context.run();
}
