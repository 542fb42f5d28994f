#pragma once
// Floats in a CUDA runtime's memory (runtime R: backend::cuda::DeviceRuntime
// on a GPU, emu::Runtime on the host), filled from and read into host
// vectors in stream order on the stream they were made for: the stream the
// optimizer that reads them steps on. (A copy on another stream, the legacy
// one for instance, is not ordered before that optimizer's kernels: a pageable
// cudaMemcpy returns once its source is staged, not once it has landed.)

#include <cstddef>
#include <vector>

#include <skewadam/engine/backend/cuda/cuda_backend.hpp>

namespace skewadam::test {

template <class R>
struct DeviceFloats {
  using Stream = typename R::stream_type;
  backend::cuda::DeviceArray<R, float> d;
  Stream stream{};

  explicit DeviceFloats(const std::vector<float>& h, Stream s = Stream{}) : d(h.size()), stream(s) { put(h); }
  /// Uploads h (from pageable memory: h may change once this returns).
  void put(const std::vector<float>& h) {
    if (!h.empty()) R::to_device(d.data(), h.data(), sizeof(float) * h.size(), stream);
  }
  /// The values once the stream's work so far has run (waits for it).
  std::vector<float> get() const {
    std::vector<float> h(d.size());
    if (!h.empty()) R::to_host(h.data(), d.data(), sizeof(float) * h.size(), stream);
    return h;
  }
};

}  // namespace skewadam::test
