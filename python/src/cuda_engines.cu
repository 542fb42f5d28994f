// The CUDA engines of every variant, for parameters on a CUDA device
// (compiled by nvcc when the installed torch has CUDA; setup.py).

#include <skewadam/torch/cuda.cuh>

SKEWADAM_LIBTORCH_CUDA_ALL_VARIANTS()
