#pragma once
// What the CUDA backend's engines (placement/local_cuda.hpp, sharded_cuda.hpp)
// do with the runtime's memory besides launching kernels, in stream order on
// runtime R: arrays zeroed, uploaded, viewed and downloaded; the parameter
// copies checkpoints need; and the check that a parameter and its gradient
// are memory the kernels can reach.

#include <cstddef>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "../../tensor_view.hpp"
#include "cuda_backend.hpp"

namespace skewadam::backend::cuda {

template <class R>
struct DeviceMemory {
  using Stream = typename R::stream_type;
  template <class T>
  using Array = DeviceArray<R, T>;

  /// a becomes n zeros of T; returns its data.
  template <class T>
  static T* zeroed(Array<T>& a, std::size_t n, Stream s) {
    a = Array<T>(n);
    if (n > 0) R::zero(a.data(), a.bytes(), s);
    return a.data();
  }
  /// d becomes a device copy of v (v may be freed once the stream has run it).
  template <class T>
  static void upload(Array<T>& d, const std::vector<T>& v, Stream s) {
    d = Array<T>(v.size());
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

  /// std::invalid_argument naming the parameter unless p and g are the
  /// runtime's memory.
  static void check(std::string_view name, const ParamView& p, const GradView& g) {
    if (p.numel() > 0) R::check_device_memory(p.data, "param of '" + std::string(name) + "'");
    if (g.present() && g.numel() > 0) R::check_device_memory(g.data, "grad of '" + std::string(name) + "'");
  }
};

}  // namespace skewadam::backend::cuda
