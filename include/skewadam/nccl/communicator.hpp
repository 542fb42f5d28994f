#pragma once
// NcclCommunicator: the Communicator concept (dist/communicator.hpp) on an
// NCCL communicator, for one rank per GPU. Needs the CUDA runtime and NCCL
// (<cuda_runtime.h>, <nccl.h>): build with SKEWADAM_WITH_NCCL and link
// CUDA::cudart and nccl.
//
//   ncclComm_t nc;  ncclCommInitRank(&nc, world, id, rank);   // id shared through MPI or a file
//   skewadam::nccl::NcclCommunicator comm(nc, stream);
//   skewadam::dist::ShardedOptimizer<Tiers, skewadam::nccl::NcclCommunicator> opt(comm, hyper);
//
// The concept's buffers are host memory (the sharded optimizer's exchanges are
// a few floats per matrix): each call stages them through a device buffer on
// `stream`, runs the NCCL collective and waits for the stream. NCCL has no
// all-gather with counts per rank; all_gather_v gathers blocks padded to the
// largest count and packs them. Errors raise NcclError; the communicator and
// stream are not owned.

#include <cuda_runtime.h>
#include <nccl.h>

#include <cstddef>
#include <cstring>
#include <span>
#include <stdexcept>
#include <string>
#include <vector>

#include "../comm/communicator.hpp"

namespace skewadam::nccl {

class NcclError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

namespace detail {
inline void check(ncclResult_t rc, const char* what) {
  if (rc != ncclSuccess) throw NcclError(std::string(what) + ": " + ncclGetErrorString(rc));
}
inline void check(cudaError_t rc, const char* what) {
  if (rc != cudaSuccess) throw NcclError(std::string(what) + ": " + cudaGetErrorString(rc));
}
}  // namespace detail

class NcclCommunicator {
 public:
  NcclCommunicator(ncclComm_t comm, cudaStream_t stream) : comm_(comm), stream_(stream) {
    detail::check(ncclCommUserRank(comm_, &rank_), "ncclCommUserRank");
    detail::check(ncclCommCount(comm_, &size_), "ncclCommCount");
  }
  NcclCommunicator(const NcclCommunicator&) = delete;
  NcclCommunicator& operator=(const NcclCommunicator&) = delete;
  ~NcclCommunicator() {
    if (device_) cudaFree(device_);
  }

  int rank() const noexcept { return rank_; }
  int size() const noexcept { return size_; }
  ncclComm_t native() const noexcept { return comm_; }

  void all_gather(std::span<const std::byte> mine, std::span<std::byte> all) {
    const std::size_t n = mine.size();
    dist::detail::check_all_gather(n, all.size(), size_);
    if (n == 0) return;
    std::byte* d = room(n * (static_cast<std::size_t>(size_) + 1));
    std::byte* recv = d + n;
    to_device(d, mine.data(), n);
    detail::check(ncclAllGather(d, recv, n, ncclChar, comm_, stream_), "ncclAllGather");
    to_host(all.data(), recv, all.size());
  }

  void all_gather_v(std::span<const std::byte> mine, std::span<std::byte> all, std::span<const std::size_t> counts) {
    dist::detail::check_all_gather_v(mine.size(), all.size(), counts, rank_, size_);
    dist::detail::all_gather_v_padded(mine, all, counts, padded_,
                                      [&](std::span<const std::byte> in, std::span<std::byte> out) { all_gather(in, out); });
  }

  void all_reduce_sum(std::span<float> values) { reduce(values.data(), values.size(), sizeof(float), ncclFloat); }
  void all_reduce_sum(std::span<double> values) { reduce(values.data(), values.size(), sizeof(double), ncclDouble); }

  void broadcast(std::span<std::byte> buffer, int root) {
    if (root < 0 || root >= size_)
      throw std::invalid_argument("root = " + std::to_string(root) + ": must be in 0.." + std::to_string(size_ - 1));
    if (buffer.empty()) return;
    std::byte* d = room(buffer.size());
    to_device(d, buffer.data(), buffer.size());
    detail::check(ncclBroadcast(d, d, buffer.size(), ncclChar, root, comm_, stream_), "ncclBroadcast");
    to_host(buffer.data(), d, buffer.size());
  }

  void barrier() {
    float one = 0.0f;
    all_reduce_sum(std::span<float>(&one, 1));
  }

 private:
  void reduce(void* values, std::size_t count, std::size_t elem, ncclDataType_t type) {
    if (count == 0) return;
    std::byte* d = room(count * elem);
    to_device(d, values, count * elem);
    detail::check(ncclAllReduce(d, d, count, type, ncclSum, comm_, stream_), "ncclAllReduce");
    to_host(values, d, count * elem);
  }

  std::byte* room(std::size_t bytes) {
    if (bytes > capacity_) {
      if (device_) detail::check(cudaFree(device_), "cudaFree");
      device_ = nullptr;
      capacity_ = 0;
      void* p = nullptr;
      detail::check(cudaMalloc(&p, bytes), "cudaMalloc");
      device_ = static_cast<std::byte*>(p);
      capacity_ = bytes;
    }
    return device_;
  }
  void to_device(void* d, const void* h, std::size_t n) {
    detail::check(cudaMemcpyAsync(d, h, n, cudaMemcpyHostToDevice, stream_), "cudaMemcpyAsync");
  }
  void to_host(void* h, const void* d, std::size_t n) {
    detail::check(cudaMemcpyAsync(h, d, n, cudaMemcpyDeviceToHost, stream_), "cudaMemcpyAsync");
    detail::check(cudaStreamSynchronize(stream_), "cudaStreamSynchronize");
  }

  ncclComm_t comm_;
  cudaStream_t stream_;
  int rank_ = 0;
  int size_ = 1;
  std::byte* device_ = nullptr;
  std::size_t capacity_ = 0;
  std::vector<std::byte> padded_;  // all_gather_v's padded bytes
};
static_assert(dist::Communicator<NcclCommunicator>, "NcclCommunicator must model skewadam::dist::Communicator");

}  // namespace skewadam::nccl
