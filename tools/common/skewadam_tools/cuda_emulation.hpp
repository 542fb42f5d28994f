#pragma once
// Runs CUDA kernels written for engine/backend/cuda/kernels.cuh on the host, so that
// their logic (work cutting, block reductions, barriers, the order of the
// passes) is tested on machines without a GPU. Include this before
// kernels.cuh in a translation unit compiled by the C++ compiler.
//
// A block is blockDim.x fibers on one host thread (each started once with
// makecontext and kept for the blocks that follow, then switched with the
// compiler's __builtin_setjmp/__builtin_longjmp, which save and restore
// three registers and make no library call: no signal mask, no cleanup
// handlers, no _FORTIFY_SOURCE check of the stack), run in thread order
// until each reaches a barrier; a barrier opens when every thread of its
// block (__syncthreads) or warp (__shfl_xor_sync) that has not returned
// waits at it. A warp shuffle waits once: its lanes write one of two
// buffers, alternately, and a lane can write a buffer again only after
// every lane has passed the next shuffle's barrier, so after each has read
// it. __shared__ variables are per host thread, so each block has
// its own. A kernel whose threads wait at different barriers is reported
// (std::logic_error from emu::launch) rather than hung.
//
// The blocks of a launch run in the order the schedule gives (emu::Schedule,
// from SKEWADAM_EMU_BLOCKS unless a test sets it):
//   serial           block 0, 1, 2, ... on the calling thread (the default):
//                    the same launch interleaves the same way every time
//   shuffled[:SEED]  one after another on the calling thread, in an order
//                    drawn anew for each launch from SEED: a block that
//                    reads what a later block of the same launch writes
//                    (a cross-block race) sees it only by chance
//   concurrent[:N]   shuffled, and N host threads (default 2) take the
//                    blocks as they come, so that blocks overlap in time
// A kernel that is right on a GPU gives the same bits under all three (its
// cross-block results are ordered by counters and fences, atomicAdd is
// atomic here); a racy one differs under the last two.
//
// A vector access of kernels.cuh (load_quad, store_quad) at an address that
// is not a multiple of its size, which faults on a GPU, is reported by the
// launch as a std::logic_error naming the address, the block and the thread.
// Timing and memory-model subtleties beyond these are not emulated.

#include <ucontext.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <numeric>
#include <stdexcept>
#include <string>
#include <thread>
#include <type_traits>
#include <vector>

#define SKEWADAM_CUDA_EMULATION 1
#define __global__
#define __device__
#define __host__
#define __shared__ static thread_local
#define __launch_bounds__(...)

struct uint3 {
  unsigned x = 0, y = 0, z = 0;
};
inline thread_local uint3 threadIdx;
inline thread_local uint3 blockIdx;
inline thread_local uint3 blockDim;
inline thread_local uint3 gridDim;

namespace emu {

// ------------------------------------------------------------- the schedule
enum class Order { serial, shuffled, concurrent };

struct Schedule {
  Order order = Order::serial;
  unsigned threads = 2;        ///< concurrent: host threads
  std::uint64_t seed = 1;      ///< shuffled, concurrent: the orders' seed

  /// "serial", "shuffled[:SEED]" or "concurrent[:THREADS]"; throws
  /// std::invalid_argument naming `who` for anything else.
  static Schedule parse(const std::string& text, const std::string& who) {
    Schedule s;
    const auto colon = text.find(':');
    const std::string kind = text.substr(0, colon);
    const std::string arg = colon == std::string::npos ? "" : text.substr(colon + 1);
    auto number = [&](std::uint64_t lo, std::uint64_t hi) {
      char* end = nullptr;
      const unsigned long long v = std::strtoull(arg.c_str(), &end, 10);
      if (arg.empty() || *end != '\0' || v < lo || v > hi)
        throw std::invalid_argument(who + "=" + text + ": '" + arg + "' is not a number in " + std::to_string(lo) +
                                    ".." + std::to_string(hi));
      return static_cast<std::uint64_t>(v);
    };
    if (kind == "serial" && colon == std::string::npos) {
      s.order = Order::serial;
    } else if (kind == "shuffled") {
      s.order = Order::shuffled;
      if (colon != std::string::npos) s.seed = number(0, UINT64_MAX);
    } else if (kind == "concurrent") {
      s.order = Order::concurrent;
      if (colon != std::string::npos) s.threads = static_cast<unsigned>(number(1, 64));
    } else {
      throw std::invalid_argument(who + "=" + text + ": expected serial, shuffled[:SEED] or concurrent[:THREADS]");
    }
    return s;
  }
  std::string str() const {
    switch (order) {
      case Order::serial: return "serial";
      case Order::shuffled: return "shuffled:" + std::to_string(seed);
      case Order::concurrent: return "concurrent:" + std::to_string(threads);
    }
    return "?";
  }
};

namespace detail {
inline Schedule& schedule_slot() {
  static Schedule s = [] {
    const char* env = std::getenv("SKEWADAM_EMU_BLOCKS");
    return env != nullptr && *env != '\0' ? Schedule::parse(env, "SKEWADAM_EMU_BLOCKS") : Schedule{};
  }();
  return s;
}
inline std::atomic<std::uint64_t>& launches() {
  static std::atomic<std::uint64_t> n{0};
  return n;
}
}  // namespace detail

/// The schedule launches follow (SKEWADAM_EMU_BLOCKS, read at the first call).
inline Schedule schedule() { return detail::schedule_slot(); }
/// Sets it for the launches that follow (not while a launch runs).
inline void set_schedule(const Schedule& s) { detail::schedule_slot() = s; }

/// Sets a schedule for its lifetime (tests).
class ScopedSchedule {
 public:
  explicit ScopedSchedule(const Schedule& s) : saved_(schedule()) { set_schedule(s); }
  ~ScopedSchedule() { set_schedule(saved_); }
  ScopedSchedule(const ScopedSchedule&) = delete;
  ScopedSchedule& operator=(const ScopedSchedule&) = delete;

 private:
  Schedule saved_;
};

// ------------------------------------------------- misaligned vector accesses
namespace detail {
struct Fault {
  std::mutex m;
  std::string what;  ///< the first fault of the running launch, or empty
};
inline Fault& fault() {
  static Fault f;
  return f;
}
}  // namespace detail

/// Records a misaligned vector access (an n-byte access at p); the launch
/// then throws. The access itself goes on (the host allows it).
inline void check_aligned(const void* p, std::size_t n) {
  if (reinterpret_cast<std::uintptr_t>(p) % n == 0) return;
  detail::Fault& f = detail::fault();
  const std::lock_guard<std::mutex> lock(f.m);
  if (!f.what.empty()) return;
  char buf[160];
  std::snprintf(buf, sizeof buf, "misaligned %zu-byte vector access at %p (block %u, thread %u): a GPU faults on it",
                n, p, blockIdx.x, threadIdx.x);
  f.what = buf;
}

// ------------------------------------------------------------------ a block
/// The fibers of one block and their scheduler (one per host thread).
class Block {
 public:
  static constexpr unsigned max_threads = 1024;
  static constexpr std::size_t stack_bytes = std::size_t{256} << 10;

  /// Runs body() as block b of a grid of `grid` blocks of `threads` threads.
  void run(unsigned b, unsigned grid, unsigned threads, const std::function<void()>& body) {
    while (fibers_.size() < threads) fibers_.push_back(std::make_unique<Fiber>());
    body_ = &body;
    blockDim = {threads, 1, 1};
    gridDim = {grid, 1, 1};
    blockIdx = {b, 0, 0};
    run_block(threads);
    body_ = nullptr;
  }

  /// Called by the running fiber: waits until every live thread of its block
  /// (warp = false) or of its warp waits too.
  void wait(bool warp) {
    Fiber& f = *fibers_[current_];
    f.state = warp ? State::warp_wait : State::block_wait;
    if (__builtin_setjmp(f.jmp) == 0) jump(scheduler_jmp_);
  }

  /// The exchange of the running thread's next warp shuffle: each lane's
  /// value, by its bytes, in the buffer its shuffles alternate to.
  unsigned char (&shuffle_buffer())[max_threads / 32][32][8] {
    Fiber& f = *fibers_[current_];
    f.shuffles ^= 1u;
    return buf_[f.shuffles];
  }

 private:
  enum class State { run, block_wait, warp_wait, done };
  /// Where a fiber or the scheduler goes on: __builtin_setjmp's buffer.
  using Resume = void* [5];
  struct Fiber {
    ucontext_t ctx{};
    Resume jmp{};
    bool started = false;
    std::unique_ptr<char[]> stack{new char[stack_bytes]};
    State state = State::done;
    unsigned shuffles = 0;  ///< the parity of the warp shuffles it began in this block
  };

  static void entry();

  /// Goes on where `to` was saved. A function of its own: __builtin_longjmp
  /// may not be called from the function that saved the buffer.
  [[gnu::noinline]] static void jump(Resume& to) { __builtin_longjmp(to, 1); }

  /// Runs f until it waits or returns. Not inlined: the __builtin_setjmp
  /// that f jumps back to stays in a frame of its own, so the caller's
  /// locals are not clobbered.
  [[gnu::noinline]] void resume(Fiber& f) {
    if (__builtin_setjmp(scheduler_jmp_) != 0) return;  // f jumped back
    if (f.started) jump(f.jmp);
    f.started = true;
    ucontext_t here;
    swapcontext(&here, &f.ctx);  // never resumed: f returns by jump()
  }

  /// Gives f a fresh context that starts entry() on its own stack. Not
  /// inlined: getcontext returns twice as far as the compiler knows, which
  /// would make run_block's locals suspect.
  [[gnu::noinline]] void prepare(Fiber& f) {
    getcontext(&f.ctx);
    f.ctx.uc_stack.ss_sp = f.stack.get();
    f.ctx.uc_stack.ss_size = stack_bytes;
    f.ctx.uc_link = nullptr;  // entry() never returns
    makecontext(&f.ctx, &Block::entry, 0);
    f.started = false;
  }

  void run_block(unsigned threads) {
    for (unsigned t = 0; t < threads; ++t) {
      Fiber& f = *fibers_[t];
      // a fiber that finished a block waits in entry() for the next one; it
      // starts afresh only the first time, or after a launch abandoned it
      // at a barrier
      if (!f.started || f.state != State::done) prepare(f);
      f.state = State::run;
      f.shuffles = 0;
    }
    for (;;) {
      for (unsigned t = 0; t < threads; ++t) {
        if (fibers_[t]->state != State::run) continue;
        current_ = t;
        threadIdx = {t, 0, 0};
        resume(*fibers_[t]);
      }
      // open the barriers every live thread of the block or warp waits at
      bool live = false, runnable = false, block_wait = true;
      for (unsigned t = 0; t < threads; ++t) {
        const State s = fibers_[t]->state;
        if (s == State::done) continue;
        live = true;
        if (s != State::block_wait) block_wait = false;
      }
      if (!live) return;
      if (block_wait) {
        for (unsigned t = 0; t < threads; ++t)
          if (fibers_[t]->state == State::block_wait) fibers_[t]->state = State::run;
        continue;
      }
      for (unsigned w = 0; w * 32 < threads; ++w) {
        const unsigned lo = w * 32, hi = std::min(threads, lo + 32);
        bool all = true, any = false;
        for (unsigned t = lo; t < hi; ++t) {
          const State s = fibers_[t]->state;
          if (s == State::done) continue;
          any = true;
          if (s != State::warp_wait) all = false;
        }
        if (!any || !all) continue;
        for (unsigned t = lo; t < hi; ++t)
          if (fibers_[t]->state == State::warp_wait) fibers_[t]->state = State::run;
        runnable = true;
      }
      if (!runnable)
        throw std::logic_error("emu::launch: block " + std::to_string(blockIdx.x) +
                               ": threads wait at different barriers (a __syncthreads not reached by every "
                               "thread, or a warp shuffle inside a divergent branch)");
    }
  }

  std::vector<std::unique_ptr<Fiber>> fibers_;
  Resume scheduler_jmp_{};
  unsigned char buf_[2][max_threads / 32][32][8] = {};
  unsigned current_ = 0;
  const std::function<void()>* body_ = nullptr;

  friend Block& block();
};

/// The block this host thread runs.
inline Block& block() {
  static thread_local Block b;
  return b;
}

inline void Block::entry() {
  Block& b = block();
  // one fiber runs thread current_ of block after block: between two, it
  // waits here (started once, it makes no system call again)
  for (;;) {
    (*b.body_)();
    Fiber& f = *b.fibers_[b.current_];
    f.state = State::done;
    if (__builtin_setjmp(f.jmp) == 0) jump(b.scheduler_jmp_);
  }
}

// ------------------------------------------------------- host threads
namespace detail {

/// Host threads that run a job together with the caller; one job at a time.
class Pool {
 public:
  ~Pool() {
    {
      const std::lock_guard<std::mutex> lock(m_);
      stop_ = true;
    }
    start_.notify_all();
    for (std::thread& t : workers_) t.join();
  }

  /// Runs job() on `threads` threads (the caller one of them) and waits.
  void run(unsigned threads, const std::function<void()>& job) {
    const std::lock_guard<std::mutex> one(job_lock_);
    std::unique_lock<std::mutex> lock(m_);
    while (workers_.size() + 1 < threads) workers_.emplace_back([this, k = workers_.size()] { work(k); });
    job_ = &job;
    wanted_ = threads - 1;
    running_ = wanted_;
    ++generation_;
    lock.unlock();
    start_.notify_all();
    job();
    lock.lock();
    finished_.wait(lock, [&] { return running_ == 0; });
    job_ = nullptr;
  }

 private:
  void work(std::size_t k) {
    std::uint64_t seen = 0;
    std::unique_lock<std::mutex> lock(m_);
    for (;;) {
      start_.wait(lock, [&] { return stop_ || generation_ != seen; });
      if (stop_) return;
      seen = generation_;
      if (k >= wanted_) continue;
      const std::function<void()>* job = job_;
      lock.unlock();
      (*job)();
      lock.lock();
      if (--running_ == 0) finished_.notify_all();
    }
  }

  std::mutex job_lock_;
  std::mutex m_;
  std::condition_variable start_, finished_;
  std::vector<std::thread> workers_;
  const std::function<void()>* job_ = nullptr;
  std::size_t wanted_ = 0;
  std::size_t running_ = 0;
  std::uint64_t generation_ = 0;
  bool stop_ = false;
};

inline Pool& pool() {
  static Pool p;
  return p;
}

/// 0 .. n - 1 in an order drawn from seed (splitmix64 driving Fisher-Yates).
inline std::vector<unsigned> shuffled(unsigned n, std::uint64_t seed) {
  std::vector<unsigned> order(n);
  std::iota(order.begin(), order.end(), 0u);
  std::uint64_t s = seed;
  auto next = [&s] {
    std::uint64_t z = (s += 0x9E3779B97F4A7C15ULL);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
    return z ^ (z >> 31);
  };
  for (unsigned i = n; i > 1; --i) std::swap(order[i - 1], order[next() % i]);
  return order;
}

}  // namespace detail

/// Runs body() as grid blocks of `threads` threads (at most
/// Block::max_threads), in the order of schedule(); returns when all have.
template <class F>
void launch(unsigned grid, unsigned threads, F&& body) {
  if (threads == 0 || threads > Block::max_threads)
    throw std::invalid_argument("emu::launch: " + std::to_string(threads) + " threads per block (1.." +
                                std::to_string(Block::max_threads) + ")");
  const std::function<void()> f = [&body] { body(); };
  const Schedule s = schedule();
  const std::uint64_t launch_no = detail::launches().fetch_add(1);
  std::vector<unsigned> order;
  if (s.order == Order::serial) {
    order.resize(grid);
    std::iota(order.begin(), order.end(), 0u);
  } else {
    order = detail::shuffled(grid, s.seed * 0x2545F4914F6CDD1DULL + launch_no);
  }
  if (s.order != Order::concurrent || grid < 2 || s.threads < 2) {
    for (unsigned b : order) block().run(b, grid, threads, f);
  } else {
    std::atomic<unsigned> next{0};
    std::atomic<bool> failed{false};
    std::mutex em;
    std::exception_ptr error;
    const std::function<void()> job = [&] {
      for (;;) {
        if (failed.load()) return;
        const unsigned k = next.fetch_add(1);
        if (k >= grid) return;
        try {
          block().run(order[k], grid, threads, f);
        } catch (...) {
          const std::lock_guard<std::mutex> lock(em);
          if (!error) error = std::current_exception();
          failed = true;
        }
      }
    };
    detail::pool().run(std::min(s.threads, grid), job);
    if (error) std::rethrow_exception(error);
  }
  detail::Fault& fault = detail::fault();
  std::string what;
  {
    const std::lock_guard<std::mutex> lock(fault.m);
    what.swap(fault.what);
  }
  if (!what.empty()) throw std::logic_error("emu::launch: " + what);
}

}  // namespace emu

inline void __syncthreads() { emu::block().wait(false); }

template <class T>
T __shfl_xor_sync(unsigned /*mask*/, T v, int lane_mask) {
  static_assert(sizeof(T) <= 8 && std::is_trivially_copyable_v<T>, "__shfl_xor_sync: a value of at most 8 bytes");
  const unsigned w = threadIdx.x / 32, l = threadIdx.x % 32;
  emu::Block& b = emu::block();
  auto& buf = b.shuffle_buffer();
  std::memcpy(buf[w][l], &v, sizeof(T));
  b.wait(true);
  T r;
  std::memcpy(&r, buf[w][l ^ static_cast<unsigned>(lane_mask)], sizeof(T));
  return r;
}

inline void __threadfence() { std::atomic_thread_fence(std::memory_order_seq_cst); }

inline unsigned atomicAdd(unsigned* p, unsigned v) { return std::atomic_ref<unsigned>(*p).fetch_add(v); }

template <class T>
T __ldcg(const T* p) {
  return *p;
}
