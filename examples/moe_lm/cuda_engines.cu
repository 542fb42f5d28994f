// The library's CUDA engines for skewadam::libtorch::Optimizer on CUDA
// tensors, compiled by nvcc when the demo is built against a CUDA LibTorch
// (CMakeLists.txt). The rest of the demo is ordinary C++.
#include <skewadam/torch/cuda.cuh>

SKEWADAM_LIBTORCH_CUDA_ALL_VARIANTS()
