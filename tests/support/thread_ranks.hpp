#pragma once
// ThreadRanks<Tiers, N, Backend>: N ranks of the sharded optimizer on Backend
// (the CPU's unless told otherwise) in one process, each a thread over one
// dist::ThreadGroup, behind the interface of one optimizer,
// so that the contract suite (contract_suite.hpp) runs them as one more
// configuration: matrices cut into row slices between ranks, checked in every
// build, with no MPI.
//
// Every call runs on every rank at once, each rank on a thread of its own (so
// that the collectives inside meet), and returns rank 0's result, or throws
// rank 0's exception. Ranks that disagree (one throws, another does not) make
// the call throw std::logic_error naming them. As a trainer does, every rank
// completes its parameters from their owners after each step
// (gather_params(), or gather_param() after a step inside backward), and
// state_bytes() is the whole group's (every rank's summed), so that the
// group answers as one optimizer does. Rank 0 updates the caller's
// parameters; every other rank updates a copy of its own, made when the
// parameter is added (a view inside memory already registered maps into the
// same copy, so that an overlap is refused on every rank alike).

#include <cstddef>
#include <cstring>
#include <exception>
#include <filesystem>
#include <map>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <thread>
#include <type_traits>
#include <utility>
#include <vector>

#include <skewadam/checkpoint.hpp>
#include <skewadam/dist/sharded_optimizer.hpp>
#include <skewadam/comm/thread_communicator.hpp>
#include <skewadam/skewadam.hpp>

namespace skewadam::test {

/// Runs f(r) for every r in [0, n) at once: r = 0 on the calling thread, the
/// others each on a thread of its own; waits for them all and returns each
/// one's exception (null where it returned), where an exception leaving a
/// thread would end the process.
template <class F>
std::vector<std::exception_ptr> on_threads(int n, F&& f) {
  std::vector<std::exception_ptr> errors(static_cast<std::size_t>(n));
  auto guarded = [&](int r) {
    try {
      f(r);
    } catch (...) {
      errors[static_cast<std::size_t>(r)] = std::current_exception();
    }
  };
  std::vector<std::thread> others;
  for (int r = 1; r < n; ++r) others.emplace_back(guarded, r);
  if (n > 0) guarded(0);
  for (std::thread& t : others) t.join();
  return errors;
}

/// Runs f(communicator, rank) for every rank of one dist::ThreadGroup of n at
/// once (on_threads, so that the collectives inside meet), then rethrows the
/// lowest rank's exception, if any. (A rank that stops before a collective
/// still leaves the others waiting in it: dist/thread_communicator.hpp.)
template <class F>
void run_ranks(int n, F&& f) {
  dist::ThreadGroup group(n);
  for (const std::exception_ptr& e : on_threads(n, [&](int r) { f(group.communicator(r), r); }))
    if (e) std::rethrow_exception(e);
}

template <class Tiers, int N, class Backend = backend::DefaultBackend>
class ThreadRanks {
  static_assert(N >= 1);

 public:
  using Rank = Optimizer<Tiers, Backend, dist::Sharded<dist::ThreadCommunicator>>;

  ThreadRanks(const PerTier<Hyperparameters>& h, const OptimizerOptions& o) : group_(N) {
    for (int r = 0; r < N; ++r) comms_.push_back(group_.communicator(r));
    for (int r = 0; r < N; ++r) ranks_.push_back(std::make_unique<Rank>(comms_[static_cast<std::size_t>(r)], h, o));
  }

  /// Runs f(rank's optimizer, rank) on every rank at once; rank 0's result.
  template <class F>
  decltype(auto) all(F&& f) {
    using R = decltype(f(*ranks_[0], 0));
    std::conditional_t<std::is_void_v<R>, int, std::optional<Stored<R>>> result{};
    const std::vector<std::exception_ptr> errors = on_threads(N, [&](int r) {
      Rank& o = *ranks_[static_cast<std::size_t>(r)];
      if constexpr (std::is_void_v<R>) f(o, r);
      else if (r != 0) (void)f(o, r);
      else if constexpr (std::is_reference_v<R>) result.emplace(&f(o, r));
      else result.emplace(f(o, r));
    });
    for (int r = 1; r < N; ++r)
      if (static_cast<bool>(errors[static_cast<std::size_t>(r)]) != static_cast<bool>(errors[0]))
        throw std::logic_error("ThreadRanks: rank " + std::to_string(errors[0] ? 0 : r) + " threw (" +
                               describe(errors[errors[0] ? 0 : static_cast<std::size_t>(r)]) + ") and rank " +
                               std::to_string(errors[0] ? r : 0) + " did not");
    if (errors[0]) std::rethrow_exception(errors[0]);
    if constexpr (std::is_reference_v<R>) return static_cast<R>(**result);
    else if constexpr (!std::is_void_v<R>) return R(std::move(*result));
  }

  Rank& rank(int r) { return *ranks_.at(static_cast<std::size_t>(r)); }

  ParamId add(std::string_view name, Tier tier, ParamView param, GradView grad = {}) {
    std::vector<ParamView> views(N, param);
    for (int r = 1; r < N; ++r) views[static_cast<std::size_t>(r)].data = mirror(r, param);
    return all([&](Rank& o, int r) { return o.add(name, tier, views[static_cast<std::size_t>(r)], grad); });
  }

  // Forwarded to every rank: the front-end's interface the tests use.
#define SKEWADAM_THREAD_RANKS_FORWARD(member)                                                  \
  template <class... A>                                                                        \
  decltype(auto) member(A&&... a) {                                                           \
    return all([&](Rank& o, int) -> decltype(auto) { return o.member(a...); });               \
  }                                                                                            \
  template <class... A>                                                                        \
  decltype(auto) member(A&&... a) const {                                                     \
    return const_cast<ThreadRanks&>(*this).all(                                               \
        [&](Rank& o, int) -> decltype(auto) { return std::as_const(o).member(a...); });       \
  }
  SKEWADAM_THREAD_RANKS_FORWARD(set_grad)
  SKEWADAM_THREAD_RANKS_FORWARD(clear_grad)
  SKEWADAM_THREAD_RANKS_FORWARD(clear_grads)
  SKEWADAM_THREAD_RANKS_FORWARD(grad)
  SKEWADAM_THREAD_RANKS_FORWARD(step_open)
  SKEWADAM_THREAD_RANKS_FORWARD(stepped_in_open_step)
  SKEWADAM_THREAD_RANKS_FORWARD(check_step_inside_backward)
  SKEWADAM_THREAD_RANKS_FORWARD(step_count)
  SKEWADAM_THREAD_RANKS_FORWARD(steps)
  SKEWADAM_THREAD_RANKS_FORWARD(last_step)
  SKEWADAM_THREAD_RANKS_FORWARD(export_state)
  SKEWADAM_THREAD_RANKS_FORWARD(import_state)
  SKEWADAM_THREAD_RANKS_FORWARD(find)
  SKEWADAM_THREAD_RANKS_FORWARD(size)
  SKEWADAM_THREAD_RANKS_FORWARD(seed)
  SKEWADAM_THREAD_RANKS_FORWARD(set_lr_schedule)
  SKEWADAM_THREAD_RANKS_FORWARD(set_lr)
  SKEWADAM_THREAD_RANKS_FORWARD(set_threads)
  SKEWADAM_THREAD_RANKS_FORWARD(clip_grad_norm)
  SKEWADAM_THREAD_RANKS_FORWARD(pending_grad_scale)
  SKEWADAM_THREAD_RANKS_FORWARD(set_max_grad_norm)
  SKEWADAM_THREAD_RANKS_FORWARD(max_grad_norm)
  SKEWADAM_THREAD_RANKS_FORWARD(last_grad_norm)
  SKEWADAM_THREAD_RANKS_FORWARD(grad_norm)
  SKEWADAM_THREAD_RANKS_FORWARD(clip_norm)
  SKEWADAM_THREAD_RANKS_FORWARD(clips_by_previous_norm)
  SKEWADAM_THREAD_RANKS_FORWARD(previous_grad_norm)
#undef SKEWADAM_THREAD_RANKS_FORWARD

  /// A step, then every rank's parameters completed.
  void step() {
    all([](Rank& o, int) {
      o.step();
      if (o.last_step().applied) o.gather_params();
    });
  }
  /// A step inside backward of one tensor, then its values completed.
  void step(ParamId id) {
    all([&](Rank& o, int) {
      o.step(id);
      o.gather_param(id);
    });
  }
  StepReport finish_step(StepEnd how = StepEnd::completed) {
    return all([&](Rank& o, int) { return o.finish_step(how); });
  }

  /// The state every rank holds, summed (total, or one tier's).
  template <class... T>
  index_t state_bytes(T... tier) const {
    index_t sum = 0;
    for (const auto& r : ranks_) sum += r->state_bytes(tier...);
    return sum;
  }

  /// save_checkpoint / load_checkpoint, collective (rank 0 writes).
  void save(const std::filesystem::path& f) {
    all([&](Rank& o, int) { save_checkpoint(o, f); });
  }
  void load(const std::filesystem::path& f) {
    all([&](Rank& o, int) { load_checkpoint(o, f); });
  }

 private:
  template <class R>
  using Stored = std::conditional_t<std::is_reference_v<R>, std::remove_reference_t<R>*, R>;

  static std::string describe(const std::exception_ptr& e) {
    try {
      std::rethrow_exception(e);
    } catch (const std::exception& x) {
      return x.what();
    } catch (...) {
      return "an exception of another type";
    }
  }

  /// Rank r's copy of the memory `p` views: inside a copy already made when
  /// rank 0's view starts inside memory registered before, else a new copy.
  void* mirror(int r, const ParamView& p) {
    if (p.data == nullptr) return nullptr;
    const auto* start = static_cast<const std::byte*>(p.data);
    const std::size_t bytes = static_cast<std::size_t>(p.numel() * dtype_size(p.dtype));
    auto& copies = copies_[static_cast<std::size_t>(r)];
    auto it = copies.upper_bound(start);
    if (it != copies.begin()) {
      --it;
      if (start < it->first + it->second.size()) return it->second.data() + (start - it->first);
    }
    std::vector<std::byte> copy(bytes);
    if (bytes > 0) std::memcpy(copy.data(), start, bytes);
    return copies.emplace(start, std::move(copy)).first->second.data();
  }

  dist::ThreadGroup group_;
  std::vector<dist::ThreadCommunicator> comms_;
  std::vector<std::unique_ptr<Rank>> ranks_;
  std::map<const std::byte*, std::vector<std::byte>> copies_[N];
};

/// What a contract-suite configuration (contract_suite.hpp) of N ranks in
/// threads on Backend has in common; a configuration adds its name and
/// whether it is emulated. A cut matrix's column sums are added in another
/// grouping than one process's, so it keeps the golden tolerances, not the
/// local CPU bits.
template <int N, class Backend = backend::DefaultBackend>
struct RanksInThreads {
  static constexpr bool cpu_bits = false;
  static constexpr bool cuts_matrices = true;
  template <class Tiers>
  static auto make(const PerTier<Hyperparameters>& h, OptimizerOptions o) {
    return std::make_unique<ThreadRanks<Tiers, N, Backend>>(h, o);
  }
  template <class Opt>
  static void save(Opt& opt, const std::filesystem::path& f) {
    opt.save(f);
  }
  template <class Opt>
  static void load(Opt& opt, const std::filesystem::path& f) {
    opt.load(f);
  }
};

}  // namespace skewadam::test
