#pragma once
// emu::Runtime: the runtime of backend::CudaBackend (cuda_backend.hpp) on the
// host. Memory is host memory (every address counts as the device's), a
// launch runs the kernel's blocks on the host (cuda_emulation.hpp, in the
// order emu::schedule() gives) before it returns. Stream capture records
// launches (on this thread) to run them again; a copy, a zeroing or a wait
// while capturing throws std::logic_error, as they would break a CUDA graph
// (or be illegal in one); waits() counts the calls that would wait for a
// GPU, so that tests can show a step waits for none, and blocks() the blocks
// launched, so that they can show what a step's launches are sized to. With it the CUDA backend
// (engine/backend/cuda/cuda_backend.hpp) and its kernels run, unchanged, on
// machines without a GPU (the tests, skewadam-replay --backend cuda-emulated):
//
//   skewadam::Optimizer<skewadam::SkewAdamTiers, skewadam::backend::CudaBackend<emu::Runtime>> opt(h);
//
// Streams. Every stream behaves as a non-blocking CUDA stream
// (cudaStreamNonBlocking; the default stream, null, as well): nothing orders
// one stream's work after another's unless the host waits. A copy to the
// device or a zeroing on stream s lands at once, for the host to see, but
// stays unsynchronized until the host waits for s (synchronize(s), a
// to_host on s) or frees memory (which waits for everything, as cudaFree
// does); a launch on any other stream runs while it is still in flight: it
// sees the memory as it was before, and the write lands after it. So a
// kernel that reads what another stream uploaded without a wait between
// (the upload race of a pageable cudaMemcpy on the legacy stream followed by
// a step on a non-blocking one) reads stale data here, as it may on a GPU.
//
// Devices. There are `devices` of them, and each thread has its current one
// (0 at first), as in CUDA. Memory allocated while device d is current is
// d's; any other address (host memory handed in as a device's) is device
// 0's. launched_on() is the device that was current at this thread's last
// launch, so that tests can show which device a step ran on.

#include <skewadam_tools/cuda_emulation.hpp>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <new>
#include <stdexcept>
#include <string>
#include <vector>

#include <skewadam/engine/backend/cuda/cuda_backend.hpp>

namespace emu {

struct Runtime {
  using stream_type = void*;
  using graph_type = std::shared_ptr<const std::vector<std::function<void()>>>;
  static constexpr std::align_val_t alignment{256};  // as cudaMalloc's

  static constexpr int devices = 4;

  static void* allocate(std::size_t bytes) {
    void* p = ::operator new(bytes == 0 ? 1 : bytes, alignment);
    if (current() != 0) {
      const std::lock_guard<std::mutex> lock(placed().m);
      placed().at[reinterpret_cast<std::uintptr_t>(p)] = Placed{bytes, current()};
    }
    return p;
  }
  static void release(void* p) noexcept {
    settle_all();  // cudaFree waits for the device
    {
      const std::lock_guard<std::mutex> lock(placed().m);
      placed().at.erase(reinterpret_cast<std::uintptr_t>(p));
    }
    ::operator delete(p, alignment);
  }
  static void zero(void* p, std::size_t n, stream_type s) {
    not_capturing("zero");
    write(p, nullptr, n, s);
  }
  static void to_device(void* dst, const void* src, std::size_t n, stream_type s) {
    not_capturing("to_device");
    write(dst, src, n, s);
  }
  static void to_host(void* dst, const void* src, std::size_t n, stream_type s) {
    not_capturing("to_host");
    ++waits();
    settle(s);
    std::memcpy(dst, src, n);
  }
  static void synchronize(stream_type s) {
    not_capturing("synchronize");
    ++waits();
    settle(s);
  }
  /// Calls so far that would wait for a GPU (to_host, synchronize), on this thread.
  static long& waits() {
    thread_local long n = 0;
    return n;
  }
  /// Copies and zeroings not yet waited for (all streams).
  static std::size_t unsynchronized() {
    const std::lock_guard<std::mutex> lock(writes().m);
    return writes().list.size();
  }
  static int check_device_memory(const void* p, const std::string&) { return device_of(p); }
  static int current_device() { return current(); }
  static void set_device(int d) {
    if (d < 0 || d >= devices)
      throw std::invalid_argument("device: " + std::to_string(d) + " is not a device here (" + std::to_string(devices) +
                                  " emulated)");
    current() = d;
  }
  /// The device p is on.
  static int device_of(const void* p) {
    const auto a = reinterpret_cast<std::uintptr_t>(p);
    const std::lock_guard<std::mutex> lock(placed().m);
    auto it = placed().at.upper_bound(a);
    if (it == placed().at.begin()) return 0;
    --it;
    return a < it->first + std::max<std::size_t>(it->second.bytes, 1) ? it->second.device : 0;
  }
  /// The device that was current at this thread's last launch (-1: none yet).
  static int& launched_on() {
    thread_local int d = -1;
    return d;
  }

  static void begin_capture(stream_type) {
    if (recording()) throw std::logic_error("emulated runtime: begin_capture while capturing");
    recording() = std::make_unique<std::vector<std::function<void()>>>();
  }
  static graph_type end_capture(stream_type) {
    if (!recording()) throw std::logic_error("emulated runtime: end_capture without begin_capture");
    return graph_type(std::move(recording()));
  }
  static void abort_capture(stream_type) noexcept { recording().reset(); }
  static void launch_graph(const graph_type& g, stream_type s) {
    not_capturing("launch_graph");
    run_on(s, [&] {
      for (const auto& f : *g) f();
    });
  }

  /// Blocks launched so far (the sum of the launches' grids), on this thread.
  static long& blocks() {
    thread_local long n = 0;
    return n;
  }

  template <auto Kernel, class... Args>
  static void launch(unsigned grid, unsigned threads, stream_type s, Args... args) {
    if (grid == 0) return;
    blocks() += grid;
    launched_on() = current();
    auto run = [=] { emu::launch(grid, threads, [&] { Kernel(args...); }); };
    if (recording()) recording()->push_back(run);
    else run_on(s, run);
  }

 private:
  static int& current() {
    thread_local int d = 0;
    return d;
  }
  /// Allocations made on devices other than 0, by address.
  struct Placed {
    std::size_t bytes;
    int device;
  };
  struct Placements {
    std::mutex m;
    std::map<std::uintptr_t, Placed> at;
  };
  static Placements& placed() {
    static Placements p;
    return p;
  }

  /// A copy or zeroing on `stream` not yet waited for: the bytes it replaced
  /// and those it wrote.
  struct Write {
    stream_type stream;
    unsigned char* dst;
    std::vector<unsigned char> before, after;
  };
  struct Writes {
    std::mutex m;
    std::vector<Write> list;
  };
  static Writes& writes() {
    static Writes w;
    return w;
  }
  static void write(void* dst, const void* src, std::size_t n, stream_type s) {
    if (n == 0) return;
    auto* d = static_cast<unsigned char*>(dst);
    Write w{s, d, std::vector<unsigned char>(d, d + n), {}};
    if (src != nullptr) w.after.assign(static_cast<const unsigned char*>(src), static_cast<const unsigned char*>(src) + n);
    else w.after.assign(n, 0);
    std::memcpy(d, w.after.data(), n);
    const std::lock_guard<std::mutex> lock(writes().m);
    writes().list.push_back(std::move(w));
  }
  /// The host has waited for stream s.
  static void settle(stream_type s) {
    const std::lock_guard<std::mutex> lock(writes().m);
    std::erase_if(writes().list, [&](const Write& w) { return w.stream == s; });
  }
  static void settle_all() noexcept {
    const std::lock_guard<std::mutex> lock(writes().m);
    writes().list.clear();
  }
  /// Runs f as work on stream s: other streams' unsynchronized writes are
  /// undone while it runs (they land after it), its own stream's stand.
  /// (Holds the lock throughout: f, a launch, calls no runtime member.)
  template <class F>
  static void run_on(stream_type s, F&& f) {
    std::unique_lock<std::mutex> lock(writes().m);
    std::vector<const Write*> foreign;
    for (const Write& w : writes().list)
      if (w.stream != s) foreign.push_back(&w);
    if (foreign.empty()) {
      lock.unlock();
      f();
      return;
    }
    for (auto it = foreign.rbegin(); it != foreign.rend(); ++it)
      std::memcpy((*it)->dst, (*it)->before.data(), (*it)->before.size());
    auto land = [&] {
      for (const Write* w : foreign) std::memcpy(w->dst, w->after.data(), w->after.size());
    };
    try {
      f();
    } catch (...) {
      land();
      throw;
    }
    land();
  }

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

// The emulated passes of the shipped rules and of the tools' own, compiled
// once into skewadam_tool_kernels where it is linked (tool_kernels.hpp).
#if defined(SKEWADAM_TOOL_EMULATED_PASSES) && !defined(SKEWADAM_COMPILED_BUILDING)
#include <skewadam_tools/tool_kernels.hpp>
SKEWADAM_EMULATED_PASSES(SKEWADAM_SHIPPED_RULES, F32, extern)
SKEWADAM_EMULATED_PASSES(SKEWADAM_SHIPPED_RULES, BF16, extern)
SKEWADAM_EMULATED_PASSES(SKEWADAM_SHIPPED_RULES, F16, extern)
SKEWADAM_EMULATED_PASSES(SKEWADAM_TOOL_RULES, F32, extern)
SKEWADAM_EMULATED_PASSES(SKEWADAM_TOOL_RULES, BF16, extern)
SKEWADAM_EMULATED_PASSES(SKEWADAM_TOOL_RULES, F16, extern)
#endif
