#pragma once
// The CUDA backend's memory (engine/backend/cuda/cuda_backend.hpp): the runtime
// interface under it, arrays in the runtime's memory, and what is done with
// them besides launching kernels, in stream order on runtime R: arrays
// zeroed, uploaded, viewed and downloaded, and the check that a parameter and
// its gradient are memory the kernels can reach.
//
// Memory comes from R::allocate unless the optimizer was given an allocator
// (OptimizerOptions::device_allocator, device_allocator.hpp).
//
// The runtime interface (a runtime is a type R with static members):
//
//   R::stream_type                        what a step is ordered on
//   R::allocate(bytes) -> void*           device memory (throws std::runtime_error)
//   R::release(p) noexcept
//   R::zero(p, bytes, stream)             in stream order
//   R::to_device(dst, src, bytes, stream) from pageable host memory, in stream
//                                         order; src may be reused at return
//   R::to_host(dst, src, bytes, stream)   waits for the stream, then copies
//   R::synchronize(stream)
//   R::check_device_memory(p, who) -> int std::invalid_argument naming who
//                                         unless p is the runtime's memory;
//                                         else the device it is on (-1: any
//                                         device reaches it, managed memory)
//   R::current_device() -> int            the calling thread's current device
//   R::set_device(d)                      makes device d current (throws
//                                         std::invalid_argument if none)
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

#include <concepts>
#include <cstddef>
#include <span>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "../../../memory/device_allocator.hpp"
#include "../../../types/tensor_view.hpp"

namespace skewadam::backend::cuda {


/// The runtime members listed above (launch aside, which is a template).
template <class R>
concept Runtime = requires(void* p, const void* cp, std::size_t n, typename R::stream_type s, const std::string& who,
                           const typename R::graph_type& g, int d) {
  { R::allocate(n) } -> std::same_as<void*>;
  { R::release(p) } noexcept;
  R::zero(p, n, s);
  R::to_device(p, cp, n, s);
  R::to_host(p, cp, n, s);
  R::synchronize(s);
  { R::check_device_memory(cp, who) } -> std::same_as<int>;
  { R::current_device() } -> std::same_as<int>;
  R::set_device(d);
  R::begin_capture(s);
  { R::end_capture(s) } -> std::same_as<typename R::graph_type>;
  { R::abort_capture(s) } noexcept;
  R::launch_graph(g, s);
};

/// n values of T in the runtime's memory, or in the allocator's when one is
/// given; frees itself; movable, not copied.
template <class R, class T>
class DeviceArray {
 public:
  DeviceArray() = default;
  explicit DeviceArray(std::size_t n, const DeviceAllocator& from = {}) : from_(from) {
    if (n == 0) return;
    const std::size_t bytes = n * sizeof(T);
    void* p = from_.set() ? from_.allocate(bytes, from_.context) : R::allocate(bytes);
    if (p == nullptr)
      throw std::runtime_error("device_allocator: no memory for " + std::to_string(bytes) + " bytes");
    p_ = static_cast<T*>(p);
    n_ = n;
  }
  DeviceArray(const DeviceArray&) = delete;
  DeviceArray& operator=(const DeviceArray&) = delete;
  DeviceArray(DeviceArray&& o) noexcept
      : p_(std::exchange(o.p_, nullptr)), n_(std::exchange(o.n_, 0)), from_(o.from_) {}
  DeviceArray& operator=(DeviceArray&& o) noexcept {
    if (this != &o) {
      reset();
      p_ = std::exchange(o.p_, nullptr);
      n_ = std::exchange(o.n_, 0);
      from_ = o.from_;
    }
    return *this;
  }
  ~DeviceArray() { reset(); }

  T* data() const noexcept { return p_; }
  std::size_t size() const noexcept { return n_; }
  bool empty() const noexcept { return n_ == 0; }
  std::size_t bytes() const noexcept { return n_ * sizeof(T); }

  void reset() noexcept {
    if (p_ != nullptr) {
      if (from_.set()) from_.release(p_, from_.context);
      else R::release(p_);
    }
    p_ = nullptr;
    n_ = 0;
  }

 private:
  T* p_ = nullptr;
  std::size_t n_ = 0;
  DeviceAllocator from_{};
};

/// Device d current while it lives, then the caller's again (nothing to do
/// when d is current already, or d < 0).
template <class R>
class DeviceScope {
 public:
  explicit DeviceScope(int d) {
    if (d < 0) return;
    const int current = R::current_device();
    if (current == d) return;
    R::set_device(d);
    restore_ = current;
  }
  DeviceScope(const DeviceScope&) = delete;
  DeviceScope& operator=(const DeviceScope&) = delete;
  ~DeviceScope() {
    if (restore_ < 0) return;
    try {
      R::set_device(restore_);
    } catch (...) {  // the caller's device existed a moment ago; nothing is lost if it is gone
    }
  }

 private:
  int restore_ = -1;
};

/// What is done with device memory besides launching kernels; arrays come
/// from `from` (empty: the runtime's own).
template <class R>
struct DeviceMemory {
  using Stream = typename R::stream_type;
  template <class T>
  using Array = DeviceArray<R, T>;

  DeviceAllocator from{};

  /// n values of T, not set.
  template <class T>
  Array<T> array(std::size_t n) const {
    return Array<T>(n, from);
  }
  /// a becomes n zeros of T; returns its data.
  template <class T>
  T* zeroed(Array<T>& a, std::size_t n, Stream s) const {
    a = array<T>(n);
    if (n > 0) R::zero(a.data(), a.bytes(), s);
    return a.data();
  }
  /// d becomes a device copy of v (v may be freed once the stream has run it).
  template <class T>
  void upload(Array<T>& d, const std::vector<T>& v, Stream s) const {
    d = array<T>(v.size());
    if (!v.empty()) R::to_device(d.data(), v.data(), d.bytes(), s);
  }
  /// out becomes a host copy of d (waits for the stream).
  template <class T>
  static void download(const Array<T>& d, std::vector<T>& out, Stream s) {
    out.resize(d.size());
    if (!d.empty()) R::to_host(out.data(), d.data(), d.bytes(), s);
  }
  template <class T>
  static std::span<const T> view(const Array<T>& a) {
    return {a.data(), a.size()};
  }

  /// n bytes from device memory to the host (waits for the stream).
  static void read(void* host, const void* device, std::size_t n, Stream s) {
    if (n > 0) R::to_host(host, device, n, s);
  }
  /// n bytes of device memory set to zero before it returns: on the default
  /// stream, waited for (not ordered after other streams' work).
  static void clear(void* device, std::size_t n) {
    if (n == 0) return;
    R::zero(device, n, Stream{});
    R::synchronize(Stream{});
  }
  /// n bytes from the host to device memory, and waits for them.
  static void write(void* device, const void* host, std::size_t n, Stream s) {
    if (n == 0) return;
    R::to_device(device, host, n, s);
    R::synchronize(s);
  }

  /// std::invalid_argument naming who unless p is the runtime's memory on
  /// device d (or memory every device reaches).
  static void check_on(const void* p, int d, const std::string& who) {
    const int on = R::check_device_memory(p, who);
    if (on >= 0 && d >= 0 && on != d)
      throw std::invalid_argument(who + ": memory of device " + std::to_string(on) + ", and the optimizer's device is " +
                                  std::to_string(d));
  }
  /// std::invalid_argument naming the parameter unless p and g are the
  /// runtime's memory on device d.
  static void check(std::string_view name, const ParamView& p, const GradView& g, int d) {
    if (p.numel() > 0) check_on(p.data, d, "param of '" + std::string(name) + "'");
    if (g.present() && g.numel() > 0) check_on(g.data, d, "grad of '" + std::string(name) + "'");
  }
};

/// The memory policy of a device backend (memory/host_memory.hpp lists its
/// members): DeviceMemory's arrays, copies in the order of one stream, on
/// one device.
template <class R>
struct StreamMemory {
  static constexpr bool host = false;
  template <class T>
  using array = DeviceArray<R, T>;
  using Stream = typename R::stream_type;

  DeviceMemory<R> mem{};
  Stream stream{};
  int device = -1;

  template <class T>
  void zeroed(array<T>& a, std::size_t n) const {
    mem.zeroed(a, n, stream);
    R::synchronize(stream);
  }
  /// (waits: v is freed at return)
  template <class T>
  void upload(array<T>& a, std::vector<T>&& v) const {
    mem.upload(a, v, stream);
    R::synchronize(stream);
  }
  template <class T>
  void download(const array<T>& a, std::vector<T>& out) const {
    DeviceMemory<R>::download(a, out, stream);
  }
  template <class T>
  static std::span<const T> view(const array<T>& a) noexcept {
    return {a.data(), a.size()};
  }
  void read(void* to, const void* p, std::size_t n) const { DeviceMemory<R>::read(to, p, n, stream); }
  void write(void* p, const void* from, std::size_t n) const { DeviceMemory<R>::write(p, from, n, stream); }
  void check(std::string_view name, const ParamView& p, const GradView& g) const {
    DeviceMemory<R>::check(name, p, g, device);
  }
  DeviceScope<R> scope() const { return DeviceScope<R>(device); }
  void wait() const { R::synchronize(stream); }
};

}  // namespace skewadam::backend::cuda
