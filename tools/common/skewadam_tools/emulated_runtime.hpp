#pragma once
// emu::Runtime: the runtime of backend::CudaBackend (cuda_backend.hpp) on the
// host. Memory is host memory (every address counts as the device's), copies
// are memcpy, streams are ignored and a launch runs the kernel's blocks one
// after another on the calling thread (cuda_emulation.hpp). Stream capture
// records launches (on this thread) to run them again; a copy, a zeroing or
// a wait while capturing throws std::logic_error, as they would break a CUDA
// graph (or be illegal in one); waits() counts the calls that would wait for
// a GPU, so that tests can show a step waits for none. With it the CUDA
// backend (backend/cuda/cuda_backend.hpp) and its kernels run, unchanged, on
// machines without a GPU (the tests, skewadam-replay --backend cuda-emulated):
//
//   skewadam::Optimizer<skewadam::SkewAdamTiers, skewadam::backend::CudaBackend<emu::Runtime>> opt(h);

#include <skewadam_tools/cuda_emulation.hpp>

#include <cstddef>
#include <cstring>
#include <functional>
#include <memory>
#include <new>
#include <stdexcept>
#include <string>
#include <vector>

#include <skewadam/backend/cuda/cuda_backend.hpp>

namespace emu {

struct Runtime {
  using stream_type = void*;
  using graph_type = std::shared_ptr<const std::vector<std::function<void()>>>;
  static constexpr std::align_val_t alignment{256};  // as cudaMalloc's

  static void* allocate(std::size_t bytes) { return ::operator new(bytes == 0 ? 1 : bytes, alignment); }
  static void release(void* p) noexcept { ::operator delete(p, alignment); }
  static void zero(void* p, std::size_t n, stream_type) {
    not_capturing("zero");
    std::memset(p, 0, n);
  }
  static void to_device(void* dst, const void* src, std::size_t n, stream_type) {
    not_capturing("to_device");
    std::memcpy(dst, src, n);
  }
  static void to_host(void* dst, const void* src, std::size_t n, stream_type) {
    not_capturing("to_host");
    ++waits();
    std::memcpy(dst, src, n);
  }
  static void synchronize(stream_type) {
    not_capturing("synchronize");
    ++waits();
  }
  /// Calls so far that would wait for a GPU (to_host, synchronize), on this thread.
  static long& waits() {
    thread_local long n = 0;
    return n;
  }
  static void check_device_memory(const void*, const std::string&) {}

  static void begin_capture(stream_type) {
    if (recording()) throw std::logic_error("emulated runtime: begin_capture while capturing");
    recording() = std::make_unique<std::vector<std::function<void()>>>();
  }
  static graph_type end_capture(stream_type) {
    if (!recording()) throw std::logic_error("emulated runtime: end_capture without begin_capture");
    return graph_type(std::move(recording()));
  }
  static void abort_capture(stream_type) noexcept { recording().reset(); }
  static void launch_graph(const graph_type& g, stream_type) {
    not_capturing("launch_graph");
    for (const auto& f : *g) f();
  }

  template <auto Kernel, class... Args>
  static void launch(unsigned grid, unsigned threads, stream_type, Args... args) {
    if (grid == 0) return;
    auto run = [=] { emu::launch(grid, threads, [&] { Kernel(args...); }); };
    if (recording()) recording()->push_back(run);
    else run();
  }

 private:
  static std::unique_ptr<std::vector<std::function<void()>>>& recording() {
    thread_local std::unique_ptr<std::vector<std::function<void()>>> r;
    return r;
  }
  static void not_capturing(const char* what) {
    if (recording()) throw std::logic_error(std::string("emulated runtime: ") + what + " during stream capture");
  }
};

}  // namespace emu

namespace skewadam::tools {
/// The CUDA backend over the emulated runtime.
using EmulatedCuda = backend::CudaBackend<emu::Runtime>;
}  // namespace skewadam::tools
