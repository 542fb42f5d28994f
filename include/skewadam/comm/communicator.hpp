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

namespace detail {
/// Communicator implementations' argument checks, before anything is sent.
inline void check_all_gather(std::size_t mine, std::size_t all, int size) {
  if (all != mine * static_cast<std::size_t>(size))
    throw std::invalid_argument("all: holds " + std::to_string(all) + " bytes, expected " +
                                std::to_string(mine * static_cast<std::size_t>(size)));
}
/// Returns the total byte count.
inline std::size_t check_all_gather_v(std::size_t mine, std::size_t all, std::span<const std::size_t> counts, int rank,
                                      int size) {
  if (counts.size() != static_cast<std::size_t>(size))
    throw std::invalid_argument("counts: has " + std::to_string(counts.size()) + " entries for " + std::to_string(size) +
                                " ranks");
  if (counts[static_cast<std::size_t>(rank)] != mine)
    throw std::invalid_argument("counts[" + std::to_string(rank) + "] = " +
                                std::to_string(counts[static_cast<std::size_t>(rank)]) + " differs from this rank's " +
                                std::to_string(mine) + " bytes");
  std::size_t total = 0;
  for (std::size_t c : counts) total += c;
  if (all != total)
    throw std::invalid_argument("all: holds " + std::to_string(all) + " bytes, the counts sum to " +
                                std::to_string(total));
  return total;
}
/// all_gather_v through an all_gather of equal sizes (for transports that
/// have no gather of unequal counts): every rank's bytes padded to the
/// largest count, gathered into `room`, then packed. The counts must have
/// been checked (check_all_gather_v).
template <class Gather>
void all_gather_v_padded(std::span<const std::byte> mine, std::span<std::byte> all, std::span<const std::size_t> counts,
                         std::vector<std::byte>& room, Gather&& all_gather) {
  std::size_t widest = 0;
  for (std::size_t c : counts) widest = c > widest ? c : widest;
  if (widest == 0) return;
  const std::size_t ranks = counts.size();
  room.assign(widest * (ranks + 1), std::byte{0});
  if (!mine.empty()) std::memcpy(room.data(), mine.data(), mine.size());
  const std::span<std::byte> gathered(room.data() + widest, widest * ranks);
  all_gather(std::span<const std::byte>(room.data(), widest), gathered);
  std::size_t at = 0;
  for (std::size_t k = 0; k < ranks; ++k) {
    if (counts[k] > 0) std::memcpy(all.data() + at, gathered.data() + k * widest, counts[k]);
    at += counts[k];
  }
}
}  // namespace detail

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
