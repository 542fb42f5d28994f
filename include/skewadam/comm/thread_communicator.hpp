#pragma once
// ThreadGroup: a process group whose ranks are threads of one process, and
// ThreadCommunicator, one rank's handle on it (a Communicator,
// communicator.hpp). It runs the sharded placement at several ranks with no
// MPI, in one program: each thread builds its own sharded optimizer over
// group.communicator(rank), and their collectives meet here. The tests use it
// to check matrices cut into row slices against one process in every build.
//
// A collective publishes each rank's buffer, waits for every rank (a
// std::barrier), copies what it needs from the others' buffers, and waits
// again before any rank may reuse its buffer. all_reduce_sum adds the ranks'
// values in rank order, so it gives the same bits on every rank and run.
// As with any communicator, every rank must make the same collectives in the
// same order; a rank that stops calling them (an exception on one rank
// only) leaves the others waiting.

#include <barrier>
#include <cstddef>
#include <cstring>
#include <span>
#include <stdexcept>
#include <string>
#include <vector>

#include "communicator.hpp"

namespace skewadam::dist {

class ThreadCommunicator;

/// The shared part of a group of `size` ranks; it must outlive their
/// communicators.
class ThreadGroup {
 public:
  explicit ThreadGroup(int size) : size_(checked(size)), barrier_(size_), slots_(static_cast<std::size_t>(size_)) {}
  ThreadGroup(const ThreadGroup&) = delete;
  ThreadGroup& operator=(const ThreadGroup&) = delete;

  int size() const noexcept { return size_; }
  /// Rank `rank`'s communicator (for the thread that runs that rank).
  ThreadCommunicator communicator(int rank);

 private:
  friend class ThreadCommunicator;
  static int checked(int size) {
    if (size < 1) throw std::invalid_argument("size = " + std::to_string(size) + ": a group needs at least one rank");
    return size;
  }
  int size_;
  std::barrier<> barrier_;
  std::vector<std::span<const std::byte>> slots_;  ///< each rank's buffer during a collective
};

class ThreadCommunicator {
 public:
  int rank() const noexcept { return rank_; }
  int size() const noexcept { return group_->size_; }

  void all_gather(std::span<const std::byte> mine, std::span<std::byte> all) {
    detail::check_all_gather(mine.size(), all.size(), size());
    exchange(mine, [&] {
      for (int k = 0; k < size(); ++k) copy(slot(k), all.data() + static_cast<std::size_t>(k) * mine.size());
    });
  }
  void all_gather_v(std::span<const std::byte> mine, std::span<std::byte> all, std::span<const std::size_t> counts) {
    detail::check_all_gather_v(mine.size(), all.size(), counts, rank_, size());
    exchange(mine, [&] {
      std::size_t at = 0;
      for (int k = 0; k < size(); ++k) {
        if (slot(k).size() != counts[static_cast<std::size_t>(k)])
          throw std::logic_error("all_gather_v: rank " + std::to_string(k) + " sent another byte count");
        copy(slot(k), all.data() + at);
        at += slot(k).size();
      }
    });
  }
  void all_reduce_sum(std::span<float> buffer) { reduce(buffer); }
  void all_reduce_sum(std::span<double> buffer) { reduce(buffer); }
  void broadcast(std::span<std::byte> buffer, int root) {
    if (root < 0 || root >= size())
      throw std::invalid_argument("root = " + std::to_string(root) + ": not a rank of a group of " +
                                  std::to_string(size()));
    exchange(buffer, [&] {
      if (rank_ == root) return;
      if (slot(root).size() != buffer.size())
        throw std::logic_error("broadcast: rank " + std::to_string(root) + " sent another byte count");
      copy(slot(root), buffer.data());
    });
  }
  void barrier() { group_->barrier_.arrive_and_wait(); }

 private:
  friend class ThreadGroup;
  ThreadCommunicator(ThreadGroup& group, int rank) : group_(&group), rank_(rank) {}

  std::span<const std::byte> slot(int k) const { return group_->slots_[static_cast<std::size_t>(k)]; }
  static void copy(std::span<const std::byte> from, std::byte* to) {
    if (!from.empty()) std::memcpy(to, from.data(), from.size());
  }
  /// Publishes `mine`, runs `read` once every rank has published, and
  /// returns once every rank has read. An error in `read` is thrown after
  /// the second barrier, so that no rank is left waiting.
  template <class Read>
  void exchange(std::span<const std::byte> mine, Read&& read) {
    group_->slots_[static_cast<std::size_t>(rank_)] = mine;
    barrier();
    std::string error;
    try {
      read();
    } catch (const std::exception& e) {
      error = e.what();
    }
    barrier();
    if (!error.empty()) throw std::logic_error(error);
  }
  template <class T>
  void reduce(std::span<T> buffer) {
    std::vector<T> all(buffer.size() * static_cast<std::size_t>(size()));
    all_gather(std::as_bytes(std::span<const T>(buffer)), std::as_writable_bytes(std::span<T>(all)));
    for (std::size_t i = 0; i < buffer.size(); ++i) {
      T s = all[i];
      for (std::size_t k = 1; k < static_cast<std::size_t>(size()); ++k) s += all[k * buffer.size() + i];
      buffer[i] = s;
    }
  }

  ThreadGroup* group_;
  int rank_;
};

inline ThreadCommunicator ThreadGroup::communicator(int rank) {
  if (rank < 0 || rank >= size_)
    throw std::invalid_argument("rank = " + std::to_string(rank) + ": not a rank of a group of " +
                                std::to_string(size_));
  return ThreadCommunicator(*this, rank);
}

static_assert(Communicator<ThreadCommunicator>, "ThreadCommunicator must model Communicator");

}  // namespace skewadam::dist
