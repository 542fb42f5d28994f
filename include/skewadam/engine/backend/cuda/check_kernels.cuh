#pragma once
// The CUDA backend's gradient reductions: the non-finite scan and the skip
// decision of a checked step, and the gradient sum of squares of global-norm
// clipping. Both walk a tensor in chunks of chunk_elems elements (one block
// each, "check items", built when tensors are registered); each chunk writes
// one slot, and slots are in tensor order, then element order.
//
//   scan_kernel      slot k: the first offending element of chunk k (the
//                    offends() of gradient_check.hpp, on the value scaled by
//                    the step's TaskStep grad_scale), or -1
//   decide_kernel    one block: the lowest offending slot is the step's first
//                    offender (item order, then element order, as on the CPU);
//                    when there is one it sets every tensor's TaskStep::skip,
//                    so that the step's kernels leave state and parameters
//                    alone, and records the offender for the host to read
//   squares_kernel   slot k: sum of g^2 over chunk k, in double, in a fixed
//                    order (threads' strided terms, then block_sum)
//   total_kernel     one block: the slots' sum, in a fixed order
//
// Nothing here waits for the host: a checked step is decided on the device.

#include <cstdint>

#include "../../../detail/config.hpp"
#include "../../../types/dtype.hpp"
#include "../gradient_check.hpp"
#include "kernels.cuh"

namespace skewadam::backend::cuda {

/// A tensor's gradient as the checks read it (null: not in this step).
struct GradTask {
  const void* grad = nullptr;
  Dtype dtype = Dtype::f32;
  float limit = 0.0f;   ///< gradient_limit() of the tensor
  index_t matrix_size = 0;
};

/// The offender decide_kernel found (bad = 0: none).
struct CheckOutcome {
  std::int32_t bad = 0;
  std::int32_t task = -1;
  index_t element = -1;  ///< flat index in the tensor
  float value = 0;       ///< after global-norm scaling
};

namespace detail {

/// Element o of a gradient of dtype d, as a float.
__device__ SKEWADAM_ALWAYS_INLINE float grad_value(const void* g, Dtype d, index_t o) {
  switch (d) {
    case Dtype::bf16: return to_float(static_cast<const bf16*>(g)[o]);
    case Dtype::f16: return to_float(static_cast<const f16*>(g)[o]);
    case Dtype::f32: break;
  }
  return static_cast<const float*>(g)[o];
}

__device__ SKEWADAM_ALWAYS_INLINE bool grad_offends(const GradTask& t, float scale, index_t o) {
  switch (t.dtype) {
    case Dtype::bf16: return offends(static_cast<const bf16*>(t.grad)[o], scale, t.limit);
    case Dtype::f16: return offends(static_cast<const f16*>(t.grad)[o], scale, t.limit);
    case Dtype::f32: break;
  }
  return offends(static_cast<const float*>(t.grad)[o], scale, t.limit);
}

/// The shared memory block_min works in, given by its caller.
template <class T>
struct BlockMinRoom {
  T part[block_warps];
};

/// The smallest x over the block; every thread gets it. Two __syncthreads():
/// call from every thread of a block of block_threads threads.
template <class T>
__device__ SKEWADAM_ALWAYS_INLINE T block_min(T x, BlockMinRoom<T>& room) {
  T* part = room.part;
  for (int off = 16; off > 0; off >>= 1) {
    const T y = __shfl_xor_sync(0xffffffffu, x, off);
    x = y < x ? y : x;
  }
  if ((threadIdx.x & 31u) == 0) part[threadIdx.x >> 5] = x;
  __syncthreads();
  T m = part[0];
  for (int w = 1; w < block_warps; ++w) m = part[w] < m ? part[w] : m;
  __syncthreads();
  return m;
}

inline constexpr index_t none = INT64_MAX;

}  // namespace detail

template <int = 0>
__global__ void __launch_bounds__(block_threads)
    scan_kernel(const GradTask* tasks, const TaskStep* steps, const WorkUnit* items, index_t* first, float* value) {
  const WorkUnit it = items[blockIdx.x];
  const GradTask t = tasks[it.task];
  if (t.grad == nullptr) {
    if (threadIdx.x == 0) first[it.block] = -1;
    return;
  }
  const float scale = steps[it.task].s.grad_scale;
  const index_t base = it.matrix * t.matrix_size;
  index_t best = detail::none;
  for (index_t o = it.begin + threadIdx.x; o < it.end; o += blockDim.x)
    if (detail::grad_offends(t, scale, base + o)) {
      best = base + o;  // strided: a thread's first hit is its smallest
      break;
    }
  __shared__ detail::BlockMinRoom<index_t> room;
  best = detail::block_min(best, room);
  if (threadIdx.x == 0) {
    first[it.block] = best == detail::none ? -1 : best;
    value[it.block] = best == detail::none ? 0.0f : detail::grad_value(t.grad, t.dtype, best) * scale;
  }
}

template <int = 0>
__global__ void __launch_bounds__(block_threads)
    decide_kernel(const index_t* first, const float* value, index_t n_slots, const WorkUnit* items, TaskStep* steps,
                  int n_tasks, CheckOutcome* out) {
  index_t best = detail::none;
  for (index_t k = threadIdx.x; k < n_slots; k += blockDim.x)
    if (first[k] >= 0) {
      best = k;
      break;
    }
  __shared__ detail::BlockMinRoom<index_t> room;
  best = detail::block_min(best, room);
  if (best == detail::none) {  // the same for every thread
    if (threadIdx.x == 0) *out = CheckOutcome{};
    return;
  }
  for (int k = static_cast<int>(threadIdx.x); k < n_tasks; k += static_cast<int>(blockDim.x)) steps[k].skip = 1;
  if (threadIdx.x == 0) *out = CheckOutcome{1, items[best].task, first[best], value[best]};
}

template <int = 0>
__global__ void __launch_bounds__(block_threads)
    squares_kernel(const GradTask* tasks, const WorkUnit* items, double* partial) {
  const WorkUnit it = items[blockIdx.x];
  const GradTask t = tasks[it.task];
  if (t.grad == nullptr) {
    if (threadIdx.x == 0) partial[it.block] = 0.0;
    return;
  }
  const index_t base = it.matrix * t.matrix_size;
  double x[1] = {0.0};
  for (index_t o = it.begin + threadIdx.x; o < it.end; o += blockDim.x) {
    const double g = detail::grad_value(t.grad, t.dtype, base + o);
    x[0] += g * g;
  }
  __shared__ detail::BlockSumRoom<double, 1> room;
  detail::block_sum(x, room);
  if (threadIdx.x == 0) partial[it.block] = x[0];
}

template <int = 0>
__global__ void __launch_bounds__(block_threads) total_kernel(const double* partial, index_t n, double* out) {
  double x[1] = {0.0};
  for (index_t k = threadIdx.x; k < n; k += blockDim.x) x[0] += partial[k];
  __shared__ detail::BlockSumRoom<double, 1> room;
  detail::block_sum(x, room);
  if (threadIdx.x == 0) *out = x[0];
}

}  // namespace skewadam::backend::cuda
