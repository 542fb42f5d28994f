#pragma once
// backend::cuda::DeviceRuntime: the CUDA runtime under CudaBackend
// (cuda_backend.hpp). Compiled by nvcc: a launch is kernel<<<...>>>.
//
//   skewadam::Optimizer<skewadam::SkewAdamTiers, skewadam::backend::CudaBackend<skewadam::backend::cuda::DeviceRuntime>>
//       opt(h, {.stream = stream});
//
// (skewadam/cuda.cuh names the backend skewadam::cuda::Backend.) Errors of
// the runtime become std::runtime_error naming the call; memory that is not
// the device's (or managed) is refused with std::invalid_argument.

#include <cuda_runtime.h>

#include <cstddef>
#include <stdexcept>
#include <string>
#include <utility>

#include "device_memory.hpp"

namespace skewadam::backend::cuda {

/// Throws std::runtime_error("what: <CUDA's message>") unless e is cudaSuccess.
inline void check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) {
    (void)cudaGetLastError();  // clear a sticky-free error so later calls are not blamed for it
    throw std::runtime_error(std::string(what) + ": " + cudaGetErrorString(e));
  }
}

/// Number of CUDA devices; 0 when there is none or no driver (never throws).
inline int device_count() noexcept {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    (void)cudaGetLastError();
    return 0;
  }
  return n;
}

/// An instantiated CUDA graph; destroys itself; movable, not copied.
class Graph {
 public:
  Graph() = default;
  Graph(cudaGraph_t g, cudaGraphExec_t e) noexcept : graph_(g), exec_(e) {}
  Graph(const Graph&) = delete;
  Graph& operator=(const Graph&) = delete;
  Graph(Graph&& o) noexcept : graph_(std::exchange(o.graph_, nullptr)), exec_(std::exchange(o.exec_, nullptr)) {}
  Graph& operator=(Graph&& o) noexcept {
    if (this != &o) {
      reset();
      graph_ = std::exchange(o.graph_, nullptr);
      exec_ = std::exchange(o.exec_, nullptr);
    }
    return *this;
  }
  ~Graph() { reset(); }
  cudaGraphExec_t exec() const noexcept { return exec_; }
  void reset() noexcept {
    if (exec_ != nullptr) (void)cudaGraphExecDestroy(exec_);
    if (graph_ != nullptr) (void)cudaGraphDestroy(graph_);
    exec_ = nullptr;
    graph_ = nullptr;
  }

 private:
  cudaGraph_t graph_ = nullptr;
  cudaGraphExec_t exec_ = nullptr;
};

struct DeviceRuntime {
  using stream_type = cudaStream_t;
  using graph_type = Graph;

  static void* allocate(std::size_t bytes) {
    void* p = nullptr;
    check(cudaMalloc(&p, bytes == 0 ? 1 : bytes), "cudaMalloc");
    return p;
  }
  static void release(void* p) noexcept { (void)cudaFree(p); }
  static void zero(void* p, std::size_t n, cudaStream_t s) { check(cudaMemsetAsync(p, 0, n, s), "cudaMemsetAsync"); }
  /// From pageable memory: the source is staged before the call returns.
  static void to_device(void* dst, const void* src, std::size_t n, cudaStream_t s) {
    check(cudaMemcpyAsync(dst, src, n, cudaMemcpyHostToDevice, s), "cudaMemcpyAsync (to the device)");
  }
  static void to_host(void* dst, const void* src, std::size_t n, cudaStream_t s) {
    check(cudaMemcpyAsync(dst, src, n, cudaMemcpyDeviceToHost, s), "cudaMemcpyAsync (to the host)");
    check(cudaStreamSynchronize(s), "cudaStreamSynchronize");
  }
  static void synchronize(cudaStream_t s) { check(cudaStreamSynchronize(s), "cudaStreamSynchronize"); }
  /// The device p is on (-1 for managed memory, which every device reaches).
  static int check_device_memory(const void* p, const std::string& who) {
    cudaPointerAttributes a{};
    const cudaError_t err = cudaPointerGetAttributes(&a, p);
    if (err != cudaSuccess) {
      (void)cudaGetLastError();
      throw std::invalid_argument(who + ": not a CUDA pointer (" + cudaGetErrorString(err) + ")");
    }
    if (a.type == cudaMemoryTypeManaged) return -1;
    if (a.type != cudaMemoryTypeDevice)
      throw std::invalid_argument(who + ": host memory; the CUDA backend needs device or managed memory");
    return a.device;
  }
  static int current_device() {
    int d = 0;
    check(cudaGetDevice(&d), "cudaGetDevice");
    return d;
  }
  static void set_device(int d) {
    int n = 0;
    check(cudaGetDeviceCount(&n), "cudaGetDeviceCount");
    if (d < 0 || d >= n)
      throw std::invalid_argument("device: " + std::to_string(d) + " is not a CUDA device here (" + std::to_string(n) +
                                  " found)");
    check(cudaSetDevice(d), "cudaSetDevice");
  }

  /// Stream capture (thread-local mode: other threads' CUDA calls are not
  /// affected); end_capture() instantiates what was captured.
  static void begin_capture(cudaStream_t s) {
    check(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal), "cudaStreamBeginCapture");
  }
  static Graph end_capture(cudaStream_t s) {
    cudaGraph_t g = nullptr;
    check(cudaStreamEndCapture(s, &g), "cudaStreamEndCapture");
    cudaGraphExec_t e = nullptr;
    const cudaError_t err = cudaGraphInstantiate(&e, g, 0);
    if (err != cudaSuccess) (void)cudaGraphDestroy(g);
    check(err, "cudaGraphInstantiate");
    return Graph(g, e);
  }
  /// Ends a capture that failed part way, discarding it.
  static void abort_capture(cudaStream_t s) noexcept {
    cudaGraph_t g = nullptr;
    if (cudaStreamEndCapture(s, &g) == cudaSuccess && g != nullptr) (void)cudaGraphDestroy(g);
    (void)cudaGetLastError();
  }
  static void launch_graph(const Graph& g, cudaStream_t s) { check(cudaGraphLaunch(g.exec(), s), "cudaGraphLaunch"); }

  template <auto Kernel, class... Args>
  static void launch(unsigned grid, unsigned threads, cudaStream_t s, Args... args) {
    if (grid == 0) return;
    Kernel<<<grid, threads, 0, s>>>(args...);
    check(cudaGetLastError(), "skewadam CUDA step: kernel launch");
  }
};

}  // namespace skewadam::backend::cuda
