#pragma once
// ProcessGroupCommunicator: the Communicator concept (dist/communicator.hpp)
// over a torch process group (c10d::ProcessGroup: Gloo, NCCL, MPI), so that a
// LibTorch program shards the optimizer over the group it already trains
// with, without MPI of its own.
//
//   auto store = c10::make_intrusive<c10d::FileStore>(path, world_size);
//   auto pg = c10::make_intrusive<c10d::ProcessGroupGloo>(store, rank, world_size, gloo_options);
//   skewadam::libtorch::ProcessGroupCommunicator comm(pg);
//   skewadam::dist::ShardedOptimizer<...> opt(comm, hyper);      // the library's own front-end, or
//   options.process_group = pg;                                 // skewadam::libtorch::Optimizer's option
//
// Every call is collective and waits for its completion. The bytes travel as
// CPU tensors viewing the caller's buffers; a group whose backend needs
// device tensors (NCCL) is given a `staging` device, through which each
// collective's bytes are copied. Results are the MPI communicator's: gathers
// in rank order, so the optimizer's ordered sums (dist::ordered_sum) give the
// same bits on every rank and every run. all_gather_v pads every rank's bytes
// to the largest count (process groups gather equal sizes only).
//
// A failure of the group (a timeout, a lost peer) raises ProcessGroupError
// naming the collective and carrying torch's message; a bad argument raises
// std::invalid_argument before anything is sent.
//
// Needs LibTorch built with distributed support (USE_DISTRIBUTED, as
// Debian's libtorch-dev and the PyTorch wheels are); not part of
// <skewadam/skewadam.hpp>.

#include <ATen/ATen.h>
#include <c10/util/Exception.h>
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <exception>
#include <span>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "../dist/communicator.hpp"

namespace skewadam::libtorch {

/// A collective of the process group failed.
class ProcessGroupError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

class ProcessGroupCommunicator {
 public:
  using Group = c10::intrusive_ptr<::c10d::ProcessGroup>;

  /// Uses `group` (shared). `staging`: where the collectives' bytes are put
  /// for the group (the CPU for Gloo and MPI; a CUDA device for NCCL).
  explicit ProcessGroupCommunicator(Group group, at::Device staging = at::Device(at::kCPU))
      : group_(std::move(group)), staging_(staging) {
    if (!group_) throw std::invalid_argument("group: is null");
    rank_ = group_->getRank();
    size_ = group_->getSize();
    if (size_ < 1 || rank_ < 0 || rank_ >= size_)
      throw std::invalid_argument("group: rank " + std::to_string(rank_) + " of " + std::to_string(size_) +
                                  " is not a valid place in a group");
  }

  int rank() const noexcept { return rank_; }
  int size() const noexcept { return size_; }
  const Group& group() const noexcept { return group_; }
  at::Device staging() const noexcept { return staging_; }

  void all_gather(std::span<const std::byte> mine, std::span<std::byte> all) {
    dist::detail::check_all_gather(mine.size(), all.size(), size_);
    if (mine.empty()) return;  // every rank sends nothing: no call
    gather_equal(mine.data(), mine.size(), all.data());
  }

  void all_gather_v(std::span<const std::byte> mine, std::span<std::byte> all, std::span<const std::size_t> counts) {
    dist::detail::check_all_gather_v(mine.size(), all.size(), counts, rank_, size_);
    dist::detail::all_gather_v_padded(mine, all, counts, padded_,
                                      [&](std::span<const std::byte> in, std::span<std::byte> out) {
                                        gather_equal(in.data(), in.size(), out.data());
                                      });
  }

  void all_reduce_sum(std::span<float> values) { reduce_sum(values.data(), values.size(), at::kFloat); }
  void all_reduce_sum(std::span<double> values) { reduce_sum(values.data(), values.size(), at::kDouble); }

  void broadcast(std::span<std::byte> buffer, int root) {
    if (root < 0 || root >= size_)
      throw std::invalid_argument("root = " + std::to_string(root) + ": must be in 0.." + std::to_string(size_ - 1));
    if (buffer.empty()) return;
    at::Tensor host = bytes_tensor(buffer.data(), buffer.size());
    std::vector<at::Tensor> tensors{wire(host)};
    ::c10d::BroadcastOptions options;
    options.rootRank = root;
    run("broadcast", [&] { return group_->broadcast(tensors, options); });
    back(tensors[0], host);
  }

  void barrier() {
    run("barrier", [&] { return group_->barrier(); });
  }

 private:
  static at::Tensor bytes_tensor(const void* p, std::size_t n) {
    return at::from_blob(const_cast<void*>(p), {static_cast<std::int64_t>(n)}, at::TensorOptions().dtype(at::kByte));
  }
  /// The tensor the group sees: `host` itself on CPU staging, else a copy.
  at::Tensor wire(const at::Tensor& host) const { return staging_.is_cpu() ? host : host.to(staging_); }
  void back(const at::Tensor& wired, at::Tensor& host) const {
    if (!staging_.is_cpu()) host.copy_(wired);
  }

  template <class Issue>
  void run(const char* what, Issue&& issue) {
    try {
      c10::intrusive_ptr<::c10d::Work> work = issue();
      if (!work->wait()) throw ProcessGroupError(std::string("process group ") + what + ": did not complete");
    } catch (const ProcessGroupError&) {
      throw;
    } catch (const std::exception& e) {
      throw ProcessGroupError(std::string("process group ") + what + ": " + e.what());
    }
  }

  /// Every rank's n bytes into `out` (size() n bytes, rank order).
  void gather_equal(const void* mine, std::size_t n, std::byte* out) {
    at::Tensor in_host = bytes_tensor(mine, n);
    std::vector<at::Tensor> input{wire(in_host)};
    std::vector<at::Tensor> hosts;
    hosts.reserve(static_cast<std::size_t>(size_));
    std::vector<std::vector<at::Tensor>> output(1);
    output[0].reserve(static_cast<std::size_t>(size_));
    for (int k = 0; k < size_; ++k) {
      hosts.push_back(bytes_tensor(out + static_cast<std::size_t>(k) * n, n));
      output[0].push_back(staging_.is_cpu() ? hosts.back() : at::empty_like(input[0]));
    }
    run("allgather", [&] { return group_->allgather(output, input); });
    for (int k = 0; k < size_; ++k) back(output[0][static_cast<std::size_t>(k)], hosts[static_cast<std::size_t>(k)]);
  }

  void reduce_sum(void* values, std::size_t n, at::ScalarType type) {
    if (n == 0) return;
    at::Tensor host = at::from_blob(values, {static_cast<std::int64_t>(n)}, at::TensorOptions().dtype(type));
    std::vector<at::Tensor> tensors{wire(host)};
    run("allreduce", [&] { return group_->allreduce(tensors); });
    back(tensors[0], host);
  }

  Group group_;
  at::Device staging_;
  int rank_ = 0;
  int size_ = 1;
  std::vector<std::byte> padded_;
};
static_assert(dist::Communicator<ProcessGroupCommunicator>,
              "ProcessGroupCommunicator must model skewadam::dist::Communicator");

}  // namespace skewadam::libtorch
