// The CUDA engines of every variant, for the adapter's tests on CUDA tensors
// (skewadam-torch-cuda-tests; compiled by nvcc).
#include <skewadam/torch/cuda.cuh>

SKEWADAM_LIBTORCH_CUDA_ALL_VARIANTS()
