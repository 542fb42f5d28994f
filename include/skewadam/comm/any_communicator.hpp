#pragma once
// AnyCommunicator: a Communicator (communicator.hpp) behind virtual calls,
// so that code compiled without a transport's headers can still be handed
// that transport. The LibTorch adapter's CUDA engines (torch/cuda.cuh,
// compiled by nvcc) shard over a torch process group this way without nvcc
// ever seeing c10d's headers.
//
//   skewadam::libtorch::ProcessGroupCommunicator pg_comm(group);
//   skewadam::dist::CommunicatorRef<skewadam::libtorch::ProcessGroupCommunicator> any(pg_comm);
//   skewadam::cuda::ShardedOptimizer<skewadam::SkewAdamTiers, skewadam::dist::AnyCommunicator> opt(any, hyper);
//
// The results are the wrapped communicator's, bit for bit; a virtual call per
// collective is all it adds.

#include <cstddef>
#include <span>

#include "communicator.hpp"

namespace skewadam::dist {

class AnyCommunicator {
 public:
  virtual ~AnyCommunicator() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  virtual void all_gather(std::span<const std::byte> mine, std::span<std::byte> all) = 0;
  virtual void all_gather_v(std::span<const std::byte> mine, std::span<std::byte> all,
                            std::span<const std::size_t> counts) = 0;
  virtual void all_reduce_sum(std::span<float> values) = 0;
  virtual void all_reduce_sum(std::span<double> values) = 0;
  virtual void broadcast(std::span<std::byte> buffer, int root) = 0;
  virtual void barrier() = 0;
};
static_assert(Communicator<AnyCommunicator>, "AnyCommunicator must model Communicator");

/// AnyCommunicator over a Comm it does not own (which must outlive it).
template <Communicator Comm>
class CommunicatorRef final : public AnyCommunicator {
 public:
  explicit CommunicatorRef(Comm& comm) noexcept : comm_(&comm) {}

  Comm& communicator() const noexcept { return *comm_; }

  int rank() const override { return comm_->rank(); }
  int size() const override { return comm_->size(); }
  void all_gather(std::span<const std::byte> mine, std::span<std::byte> all) override { comm_->all_gather(mine, all); }
  void all_gather_v(std::span<const std::byte> mine, std::span<std::byte> all,
                    std::span<const std::size_t> counts) override {
    comm_->all_gather_v(mine, all, counts);
  }
  void all_reduce_sum(std::span<float> values) override { comm_->all_reduce_sum(values); }
  void all_reduce_sum(std::span<double> values) override { comm_->all_reduce_sum(values); }
  void broadcast(std::span<std::byte> buffer, int root) override { comm_->broadcast(buffer, root); }
  void barrier() override { comm_->barrier(); }

 private:
  Comm* comm_;
};

}  // namespace skewadam::dist
