#pragma once
// MpiCommunicator: the Communicator concept (dist/communicator.hpp) on an MPI
// communicator (Open MPI, MPICH). Needs <mpi.h>: build with
// SKEWADAM_WITH_MPI and link MPI (CMake: MPI::MPI_CXX).
//
//   skewadam::mpi::Environment env(argc, argv);      // MPI_Init / MPI_Finalize
//   skewadam::mpi::MpiCommunicator comm;             // MPI_COMM_WORLD
//   skewadam::dist::ShardedOptimizer<...> opt(comm, hyper);
//
// An MPI error raises skewadam::mpi::MpiError with MPI's message (the
// communicator's error handler is set to MPI_ERRORS_RETURN); the library
// never aborts the job itself.

#ifndef OMPI_SKIP_MPICXX
#define OMPI_SKIP_MPICXX 1
#endif
#ifndef MPICH_SKIP_MPICXX
#define MPICH_SKIP_MPICXX 1
#endif
#include <mpi.h>

#include <climits>
#include <cstddef>
#include <span>
#include <stdexcept>
#include <string>
#include <vector>

#include "../comm/communicator.hpp"

namespace skewadam::mpi {

class MpiError : public std::runtime_error {
 public:
  MpiError(const std::string& what, int code) : std::runtime_error(what + ": " + message(code)), code_(code) {}
  int code() const noexcept { return code_; }

 private:
  static std::string message(int code) {
    char text[MPI_MAX_ERROR_STRING];
    int len = 0;
    if (MPI_Error_string(code, text, &len) != MPI_SUCCESS) return "MPI error " + std::to_string(code);
    return std::string(text, static_cast<std::size_t>(len));
  }
  int code_;
};

namespace detail {
inline void check(int rc, const char* what) {
  if (rc != MPI_SUCCESS) throw MpiError(what, rc);
}
inline int count_of(std::size_t n, const char* argument) {
  if (n > static_cast<std::size_t>(INT_MAX))
    throw std::invalid_argument(std::string(argument) + ": " + std::to_string(n) +
                                " bytes in one call, more than MPI's int count allows");
  return static_cast<int>(n);
}
}  // namespace detail

/// Initializes MPI (if not yet) for its lifetime and finalizes it after, if
/// it initialized it.
class Environment {
 public:
  Environment() {
    int ready = 0;
    detail::check(MPI_Initialized(&ready), "MPI_Initialized");
    if (!ready) {
      detail::check(MPI_Init(nullptr, nullptr), "MPI_Init");
      owner_ = true;
    }
  }
  Environment(int& argc, char**& argv) {
    int ready = 0;
    detail::check(MPI_Initialized(&ready), "MPI_Initialized");
    if (!ready) {
      detail::check(MPI_Init(&argc, &argv), "MPI_Init");
      owner_ = true;
    }
  }
  Environment(const Environment&) = delete;
  Environment& operator=(const Environment&) = delete;
  ~Environment() {
    int done = 0;
    if (owner_ && MPI_Finalized(&done) == MPI_SUCCESS && !done) MPI_Finalize();
  }

 private:
  bool owner_ = false;
};

class MpiCommunicator {
 public:
  /// Uses `comm` (not owned); MPI must be initialized.
  explicit MpiCommunicator(MPI_Comm comm = MPI_COMM_WORLD) : comm_(comm) {
    detail::check(MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN), "MPI_Comm_set_errhandler");
    detail::check(MPI_Comm_rank(comm_, &rank_), "MPI_Comm_rank");
    detail::check(MPI_Comm_size(comm_, &size_), "MPI_Comm_size");
  }

  int rank() const noexcept { return rank_; }
  int size() const noexcept { return size_; }
  MPI_Comm native() const noexcept { return comm_; }

  void all_gather(std::span<const std::byte> mine, std::span<std::byte> all) {
    dist::detail::check_all_gather(mine.size(), all.size(), size_);
    const int n = detail::count_of(mine.size(), "mine");
    detail::check(MPI_Allgather(mine.data(), n, MPI_BYTE, all.data(), n, MPI_BYTE, comm_), "MPI_Allgather");
  }

  void all_gather_v(std::span<const std::byte> mine, std::span<std::byte> all, std::span<const std::size_t> counts) {
    const std::size_t total = dist::detail::check_all_gather_v(mine.size(), all.size(), counts, rank_, size_);
    detail::count_of(total, "all");
    counts_.resize(counts.size());
    displs_.resize(counts.size());
    int at = 0;
    for (std::size_t k = 0; k < counts.size(); ++k) {
      counts_[k] = static_cast<int>(counts[k]);
      displs_[k] = at;
      at += counts_[k];
    }
    detail::check(MPI_Allgatherv(mine.data(), static_cast<int>(mine.size()), MPI_BYTE, all.data(), counts_.data(),
                                 displs_.data(), MPI_BYTE, comm_),
                  "MPI_Allgatherv");
  }

  void all_reduce_sum(std::span<float> values) {
    detail::check(MPI_Allreduce(MPI_IN_PLACE, values.data(), detail::count_of(values.size(), "values"), MPI_FLOAT,
                                MPI_SUM, comm_),
                  "MPI_Allreduce");
  }
  void all_reduce_sum(std::span<double> values) {
    detail::check(MPI_Allreduce(MPI_IN_PLACE, values.data(), detail::count_of(values.size(), "values"), MPI_DOUBLE,
                                MPI_SUM, comm_),
                  "MPI_Allreduce");
  }

  void broadcast(std::span<std::byte> buffer, int root) {
    if (root < 0 || root >= size_)
      throw std::invalid_argument("root = " + std::to_string(root) + ": must be in 0.." + std::to_string(size_ - 1));
    detail::check(MPI_Bcast(buffer.data(), detail::count_of(buffer.size(), "buffer"), MPI_BYTE, root, comm_),
                  "MPI_Bcast");
  }

  void barrier() { detail::check(MPI_Barrier(comm_), "MPI_Barrier"); }

 private:
  MPI_Comm comm_;
  int rank_ = 0;
  int size_ = 1;
  std::vector<int> counts_;
  std::vector<int> displs_;
};
static_assert(dist::Communicator<MpiCommunicator>, "MpiCommunicator must model skewadam::dist::Communicator");

}  // namespace skewadam::mpi
