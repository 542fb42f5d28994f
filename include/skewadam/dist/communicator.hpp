#pragma once
// Communicator: what the sharded optimizer (sharded_optimizer.hpp) needs from
// a process group, and the group of one process.
//
// A communicator has a rank in [0, size) and offers, on host memory:
//   all_gather(mine, all)            every rank's equal-sized bytes, in rank order
//   all_gather_v(mine, all, counts)  the same with counts[k] bytes from rank k
//   all_reduce_sum(buffer)           float or double sums over the ranks (the
//                                    library's implementation's order: fast,
//                                    but not promised to be the same bits on
//                                    every rank or every run)
//   broadcast(buffer, root)          root's bytes to every rank
//   barrier()
// Every call is collective: all ranks call it, in the same order, with the
// same sizes.
//
// Determinism: the optimizer never uses all_reduce_sum for its own sums. It
// gathers every rank's partials and adds them in rank order on every rank
// (ordered_sum below), so all ranks agree bit for bit and the same rank count
// gives the same bits on every run, whatever the transport.
//
// Implementations: SelfCommunicator (here, one process), MpiCommunicator
// (mpi/communicator.hpp, SKEWADAM_WITH_MPI) and NcclCommunicator
// (nccl/communicator.hpp, SKEWADAM_WITH_NCCL).

#include <concepts>
#include <cstddef>
#include <cstring>
#include <span>
#include <stdexcept>
#include <string>
#include <vector>

namespace skewadam::dist {

template <class C>
concept Communicator = requires(C& c, const C& cc, std::span<const std::byte> in, std::span<std::byte> out,
                                std::span<const std::size_t> counts, std::span<float> f, std::span<double> d,
                                int root) {
  { cc.rank() } -> std::convertible_to<int>;
  { cc.size() } -> std::convertible_to<int>;
  c.all_gather(in, out);
  c.all_gather_v(in, out, counts);
  c.all_reduce_sum(f);
  c.all_reduce_sum(d);
  c.broadcast(out, root);
  c.barrier();
};

/// The group of one process: every collective is a copy or nothing.
class SelfCommunicator {
 public:
  int rank() const noexcept { return 0; }
  int size() const noexcept { return 1; }
  void all_gather(std::span<const std::byte> mine, std::span<std::byte> all) const {
    if (all.size() != mine.size())
      throw std::invalid_argument("all: holds " + std::to_string(all.size()) + " bytes, expected " +
                                  std::to_string(mine.size()));
    if (!mine.empty()) std::memcpy(all.data(), mine.data(), mine.size());
  }
  void all_gather_v(std::span<const std::byte> mine, std::span<std::byte> all,
                    std::span<const std::size_t> counts) const {
    if (counts.size() != 1 || counts[0] != mine.size())
      throw std::invalid_argument("counts: must hold this rank's byte count only");
    all_gather(mine, all);
  }
  void all_reduce_sum(std::span<float>) const noexcept {}
  void all_reduce_sum(std::span<double>) const noexcept {}
  void broadcast(std::span<std::byte>, int root) const {
    if (root != 0) throw std::invalid_argument("root = " + std::to_string(root) + ": the group has rank 0 only");
  }
  void barrier() const noexcept {}
};
static_assert(Communicator<SelfCommunicator>, "SelfCommunicator must model Communicator");

/// Gathers `mine` (n values of a trivially copyable T) from every rank into
/// `all` (size() * n values, rank k's at [k n, (k + 1) n)).
template <Communicator Comm, class T>
void all_gather_values(Comm& comm, std::span<const T> mine, std::span<T> all) {
  comm.all_gather(std::as_bytes(mine), std::as_writable_bytes(all));
}

/// Sums `values` over the ranks in rank order ((x0 + x1) + x2 ...), the same
/// bits on every rank and every run for a given rank count. `values` is
/// replaced by the sum; `room` is scratch that grows to size() * n.
template <Communicator Comm, class T>
void ordered_sum(Comm& comm, std::span<T> values, std::vector<T>& room) {
  const auto n = values.size();
  const auto ranks = static_cast<std::size_t>(comm.size());
  room.resize(n * ranks);
  all_gather_values<Comm, T>(comm, std::span<const T>(values.data(), n), std::span<T>(room.data(), room.size()));
  for (std::size_t i = 0; i < n; ++i) {
    T s = room[i];
    for (std::size_t k = 1; k < ranks; ++k) s += room[k * n + i];
    values[i] = s;
  }
}

}  // namespace skewadam::dist
