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

#include "../comm/communicator.hpp"

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
    if (staging_.is_cpu() && backend_name(group_) == "nccl")
      throw std::invalid_argument("staging: an NCCL group exchanges CUDA tensors; give it a CUDA device to stage "
                                  "its bytes through, not the CPU");
  }

  /// The name of the group's backend ("gloo", "nccl", "mpi"), or "" where
  /// the group does not say.
  static std::string backend_name(const Group& group) {
    try {
      return group ? std::string(group->getBackendName()) : std::string();
    } catch (const std::exception&) {
      return {};
    }
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
  /// The tensor the group sees: `host` itself on CPU staging, else its copy
  /// at the start of the staging buffer.
  at::Tensor wire(const at::Tensor& host) {
    if (staging_.is_cpu()) return host;
    at::Tensor staged = staged_bytes(host.numel() * host.element_size()).view(host.scalar_type());
    staged.copy_(host);
    return staged;
  }
  void back(const at::Tensor& wired, at::Tensor& host) const {
    if (!staging_.is_cpu()) host.copy_(wired);
  }
  /// The first n bytes of the staging device's buffer, which grows as needed
  /// and is reused by every collective after.
  at::Tensor staged_bytes(std::int64_t n) {
    if (!staging_buffer_.defined() || staging_buffer_.numel() < n)
      staging_buffer_ = at::empty({n}, at::TensorOptions().dtype(at::kByte).device(staging_));
    return staging_buffer_.narrow(0, 0, n);
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

  /// Every rank's n bytes into `out` (size() n bytes, rank order). Staged
  /// on a device: this rank's bytes, then every rank's, in one buffer, one
  /// copy each way.
  void gather_equal(const void* mine, std::size_t n, std::byte* out) {
    const auto bytes = static_cast<std::int64_t>(n);
    at::Tensor all_host = bytes_tensor(out, n * static_cast<std::size_t>(size_));
    at::Tensor room = staging_.is_cpu() ? at::Tensor() : staged_bytes(bytes * (size_ + 1));
    std::vector<at::Tensor> input{bytes_tensor(mine, n)};
    if (room.defined()) input[0] = room.narrow(0, 0, bytes).copy_(input[0]);
    std::vector<std::vector<at::Tensor>> output(1);
    output[0].reserve(static_cast<std::size_t>(size_));
    for (int k = 0; k < size_; ++k)
      output[0].push_back(room.defined() ? room.narrow(0, bytes * (k + 1), bytes)
                                         : all_host.narrow(0, bytes * k, bytes));
    run("allgather", [&] { return group_->allgather(output, input); });
    if (room.defined()) all_host.copy_(room.narrow(0, bytes, bytes * size_));
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
  at::Tensor staging_buffer_;  // on staging_, when it is a device
};
static_assert(dist::Communicator<ProcessGroupCommunicator>,
              "ProcessGroupCommunicator must model skewadam::dist::Communicator");

}  // namespace skewadam::libtorch
