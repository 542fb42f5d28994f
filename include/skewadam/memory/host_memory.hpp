#pragma once
// HostMemory: the memory policy of a backend whose memory is the host's (the
// CPU backend). A memory policy is what the engine (engine.hpp) needs of a
// backend's memory to own the optimizer state there (engine/state_store.hpp)
// and to copy parameters in and out; backend::cuda::StreamMemory
// (engine/backend/cuda/device_memory.hpp) is the device's:
//
//   host                      true where the memory is the host's: arrays
//                             are read in place, nothing is copied
//   array<T>                  an owning array of T in that memory (size(),
//                             data(), empty(), movable)
//   zeroed(a, n)              a becomes n zeros
//   upload(a, std::move(v))   a becomes v's values (the host's: v itself)
//   download(a, out)          out becomes a host copy of a's values
//   view(a)                   a's values where they are (a span)
//   read(host, p, n)          n bytes at p to the host
//   write(p, host, n)         n bytes from the host to p
//   check(name, param, grad)  std::invalid_argument naming the parameter
//                             unless both are memory of this policy
//   scope()                   an object that keeps the memory's device
//                             current while it lives
//   wait()                    until the work enqueued on the memory is done
//
// Every member waits for what it copies: a host vector may be freed once it
// returns.

#include <cstddef>
#include <cstring>
#include <span>
#include <string_view>
#include <utility>
#include <vector>

#include "../types/tensor_view.hpp"

namespace skewadam {

struct HostMemory {
  static constexpr bool host = true;
  template <class T>
  using array = std::vector<T>;

  template <class T>
  void zeroed(std::vector<T>& a, std::size_t n) const {
    a.assign(n, T{});
  }
  template <class T>
  void upload(std::vector<T>& a, std::vector<T>&& v) const noexcept {
    a = std::move(v);
  }
  template <class T>
  void download(const std::vector<T>& a, std::vector<T>& out) const {
    out = a;
  }
  template <class T>
  static std::span<const T> view(const std::vector<T>& a) noexcept {
    return a;
  }
  void read(void* to, const void* p, std::size_t n) const noexcept {
    if (n > 0) std::memcpy(to, p, n);
  }
  void write(void* p, const void* from, std::size_t n) const noexcept {
    if (n > 0) std::memcpy(p, from, n);
  }
  void check(std::string_view, const ParamView&, const GradView&) const noexcept {}
  /// Nothing to make current.
  struct Scope {};
  Scope scope() const noexcept { return {}; }
  void wait() const noexcept {}
};

}  // namespace skewadam
