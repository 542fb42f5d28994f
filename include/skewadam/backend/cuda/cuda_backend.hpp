#pragma once
// CudaBackend<Runtime>: the CUDA backend. Its kernels (kernels.cuh,
// check_kernels.cuh) walk device memory; the runtime under it allocates that
// memory, copies to and from the host and launches the kernels:
//
//   R::stream_type                        what a step is ordered on
//   R::allocate(bytes) -> void*           device memory (throws std::runtime_error)
//   R::release(p) noexcept
//   R::zero(p, bytes, stream)             in stream order
//   R::to_device(dst, src, bytes, stream) from pageable host memory, in stream
//                                         order; src may be reused at return
//   R::to_host(dst, src, bytes, stream)   waits for the stream, then copies
//   R::synchronize(stream)
//   R::check_device_memory(p, who)        std::invalid_argument naming who
//                                         unless p is the runtime's memory
//   R::template launch<&kernel<...>>(grid, threads, stream, args...)
//   R::graph_type                         launches captured for replay
//   R::begin_capture(stream)              from here on the stream's launches
//                                         are recorded, not run; copies and
//                                         waits are errors until
//   R::end_capture(stream) -> graph_type  (or R::abort_capture(stream) noexcept)
//   R::launch_graph(graph, stream)        runs the recorded launches again
//
// backend::cuda::DeviceRuntime (runtime.cuh, compiled by nvcc) is the CUDA
// runtime; the emulated runtime (tools/common/skewadam_tools/
// emulated_runtime.hpp) runs the same kernels on the host, so that
// everything above the runtime is tested on machines without a GPU.
//
// The engine that uses it is the local placement's (placement/local_cuda.hpp).

#include <concepts>
#include <cstddef>
#include <string>
#include <utility>

namespace skewadam::backend {

namespace cuda {

/// The runtime members listed above (launch aside, which is a template).
template <class R>
concept Runtime = requires(void* p, const void* cp, std::size_t n, typename R::stream_type s, const std::string& who,
                           const typename R::graph_type& g) {
  { R::allocate(n) } -> std::same_as<void*>;
  { R::release(p) } noexcept;
  R::zero(p, n, s);
  R::to_device(p, cp, n, s);
  R::to_host(p, cp, n, s);
  R::synchronize(s);
  R::check_device_memory(cp, who);
  R::begin_capture(s);
  { R::end_capture(s) } -> std::same_as<typename R::graph_type>;
  { R::abort_capture(s) } noexcept;
  R::launch_graph(g, s);
};

/// n values of T in the runtime's memory; frees itself; movable, not copied.
template <class R, class T>
class DeviceArray {
 public:
  DeviceArray() = default;
  explicit DeviceArray(std::size_t n) : n_(n) {
    if (n_ > 0) p_ = static_cast<T*>(R::allocate(n_ * sizeof(T)));
  }
  DeviceArray(const DeviceArray&) = delete;
  DeviceArray& operator=(const DeviceArray&) = delete;
  DeviceArray(DeviceArray&& o) noexcept : p_(std::exchange(o.p_, nullptr)), n_(std::exchange(o.n_, 0)) {}
  DeviceArray& operator=(DeviceArray&& o) noexcept {
    if (this != &o) {
      reset();
      p_ = std::exchange(o.p_, nullptr);
      n_ = std::exchange(o.n_, 0);
    }
    return *this;
  }
  ~DeviceArray() { reset(); }

  T* data() const noexcept { return p_; }
  std::size_t size() const noexcept { return n_; }
  bool empty() const noexcept { return n_ == 0; }
  std::size_t bytes() const noexcept { return n_ * sizeof(T); }

  void reset() noexcept {
    if (p_ != nullptr) R::release(p_);
    p_ = nullptr;
    n_ = 0;
  }

 private:
  T* p_ = nullptr;
  std::size_t n_ = 0;
};

}  // namespace cuda

template <class R>
struct CudaBackend {
  static_assert(cuda::Runtime<R>, "CudaBackend<R>: R lacks a member of the runtime interface (cuda_backend.hpp)");
  using runtime = R;
};

}  // namespace skewadam::backend
