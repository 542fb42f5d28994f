#pragma once
// Runs CUDA kernels written for backend/cuda/kernels.cuh on the host, so that
// their logic (work cutting, block reductions, barriers, the order of the
// passes) is tested on machines without a GPU. Include this before
// kernels.cuh in a translation unit compiled by the C++ compiler.
//
// A block is blockDim.x fibers on the calling thread (each started with
// makecontext, then switched with _setjmp/_longjmp, which unlike
// swapcontext make no system call; with _FORTIFY_SOURCE, whose longjmp
// refuses to change stacks, swapcontext throughout), run in
// thread order until each reaches a barrier; a barrier opens when every
// thread of its block (__syncthreads) or warp (__shfl_xor_sync) that has not
// returned waits at it. Blocks run one after another; __shared__ variables
// are static. Scheduling is deterministic: the same launch interleaves the
// same way every time. As faithful as these few intrinsics and no more:
// timing and memory-model subtleties are not emulated, and a kernel whose
// threads wait at different barriers is reported (std::logic_error from
// emu::launch) rather than hung.

#include <setjmp.h>
#include <ucontext.h>

#include <algorithm>
#include <atomic>
#include <cstddef>
#include <cstring>
#include <functional>
#include <memory>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <vector>

#define __global__
#define __device__
#define __host__
#define __shared__ static
#define __launch_bounds__(...)

struct uint3 {
  unsigned x = 0, y = 0, z = 0;
};
inline uint3 threadIdx;
inline uint3 blockIdx;
inline uint3 blockDim;
inline uint3 gridDim;

namespace emu {

/// The fibers of one block and their scheduler.
class Block {
 public:
  static constexpr unsigned max_threads = 1024;
  static constexpr std::size_t stack_bytes = std::size_t{256} << 10;

  /// Runs body() as `grid` blocks of `threads` threads.
  void run(unsigned grid, unsigned threads, const std::function<void()>& body) {
    if (threads == 0 || threads > max_threads)
      throw std::invalid_argument("emu::launch: " + std::to_string(threads) + " threads per block (1.." +
                                  std::to_string(max_threads) + ")");
    while (fibers_.size() < threads) fibers_.push_back(std::make_unique<Fiber>());
    body_ = &body;
    blockDim = {threads, 1, 1};
    gridDim = {grid, 1, 1};
    for (unsigned b = 0; b < grid; ++b) {
      blockIdx = {b, 0, 0};
      run_block(threads);
    }
    body_ = nullptr;
  }

  /// Called by the running fiber: waits until every live thread of its block
  /// (warp = false) or of its warp waits too.
  void wait(bool warp) {
    Fiber& f = *fibers_[current_];
    f.state = warp ? State::warp_wait : State::block_wait;
#if defined(_FORTIFY_SOURCE)
    swapcontext(&f.ctx, &scheduler_);
#else
    if (_setjmp(f.jmp) == 0) _longjmp(scheduler_jmp_, 1);
#endif
  }

  /// A warp shuffle's exchange: each lane's value, by its bytes.
  unsigned char buf[max_threads / 32][32][8] = {};

 private:
  enum class State { run, block_wait, warp_wait, done };
  struct Fiber {
    ucontext_t ctx{};
    jmp_buf jmp{};
    bool started = false;
    std::unique_ptr<char[]> stack{new char[stack_bytes]};
    State state = State::done;
  };

  static void entry();

  /// Runs f until it waits or returns.
  void resume(Fiber& f) {
#if defined(_FORTIFY_SOURCE)
    swapcontext(&scheduler_, &f.ctx);
#else
    if (_setjmp(scheduler_jmp_) != 0) return;  // f jumped back
    if (f.started) _longjmp(f.jmp, 1);
    f.started = true;
    ucontext_t here;
    swapcontext(&here, &f.ctx);  // never resumed: f returns by _longjmp
#endif
  }

  void run_block(unsigned threads) {
    for (unsigned t = 0; t < threads; ++t) {
      Fiber& f = *fibers_[t];
      getcontext(&f.ctx);
      f.ctx.uc_stack.ss_sp = f.stack.get();
      f.ctx.uc_stack.ss_size = stack_bytes;
      f.ctx.uc_link = &scheduler_;
      makecontext(&f.ctx, &Block::entry, 0);
      f.started = false;
      f.state = State::run;
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
  ucontext_t scheduler_{};
  jmp_buf scheduler_jmp_{};
  unsigned current_ = 0;
  const std::function<void()>* body_ = nullptr;

  friend Block& block();
};

inline Block& block() {
  static Block b;
  return b;
}

inline void Block::entry() {
  Block& b = block();
  (*b.body_)();
  b.fibers_[b.current_]->state = State::done;
#if !defined(_FORTIFY_SOURCE)
  _longjmp(b.scheduler_jmp_, 1);
#endif
  // with swapcontext: returns to uc_link, the scheduler
}

/// Runs body() as grid blocks of `threads` threads (at most
/// Block::max_threads), on the calling thread.
template <class F>
void launch(unsigned grid, unsigned threads, F&& body) {
  const std::function<void()> f = [&body] { body(); };
  block().run(grid, threads, f);
}

}  // namespace emu

inline void __syncthreads() { emu::block().wait(false); }

template <class T>
T __shfl_xor_sync(unsigned /*mask*/, T v, int lane_mask) {
  static_assert(sizeof(T) <= 8 && std::is_trivially_copyable_v<T>, "__shfl_xor_sync: a value of at most 8 bytes");
  const unsigned w = threadIdx.x / 32, l = threadIdx.x % 32;
  std::memcpy(emu::block().buf[w][l], &v, sizeof(T));
  emu::block().wait(true);
  T r;
  std::memcpy(&r, emu::block().buf[w][l ^ static_cast<unsigned>(lane_mask)], sizeof(T));
  emu::block().wait(true);
  return r;
}

inline void __threadfence() { std::atomic_thread_fence(std::memory_order_seq_cst); }

inline unsigned atomicAdd(unsigned* p, unsigned v) {
  const unsigned old = *p;
  *p = old + v;
  return old;
}

template <class T>
T __ldcg(const T* p) {
  return *p;
}
