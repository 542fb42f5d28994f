#pragma once
// Runs CUDA kernels written for backend/cuda/kernels.cuh on host threads, so
// that their logic (work cutting, block reductions, barriers, the order of
// the passes) is tested on machines without a GPU. Include this before
// kernels.cuh in a translation unit compiled by the C++ compiler.
//
// A block is blockDim.x std::threads; __shared__ variables are static (blocks
// run one after another); __syncthreads and the warp intrinsics the kernels
// use are barriers over the block's or the warp's threads; fences and
// atomics are the C++ ones. Slow, and only as
// faithful as these few intrinsics: timing and memory-model subtleties are
// not emulated.

#include <atomic>
#include <barrier>
#include <functional>
#include <memory>
#include <thread>
#include <vector>

#define __global__
#define __device__
#define __host__
#define __shared__ static
#define __launch_bounds__(...)

struct uint3 {
  unsigned x = 0, y = 0, z = 0;
};
inline thread_local uint3 threadIdx;
inline thread_local uint3 blockIdx;
inline uint3 blockDim;
inline uint3 gridDim;

namespace emu {

struct Block {
  explicit Block(unsigned threads) : all(threads) {
    for (unsigned w = 0; w < (threads + 31) / 32; ++w) warps.push_back(std::make_unique<std::barrier<>>(32));
  }
  std::barrier<> all;
  std::vector<std::unique_ptr<std::barrier<>>> warps;
  double buf[64][32] = {};
};
inline Block* block = nullptr;

/// Threads that run the blocks, one after another; made once.
class Pool {
 public:
  static constexpr unsigned max_threads = 512;
  Pool() {
    for (unsigned t = 0; t < max_threads; ++t)
      threads_.emplace_back([this, t] {
        for (;;) {
          start_.arrive_and_wait();
          if (stop_) return;
          if (t < active_) {
            threadIdx = {t, 0, 0};
            blockIdx = {block_id_, 0, 0};
            (*body_)();
            // a thread that is done no longer holds the others at a barrier
            block->all.arrive_and_drop();
            block->warps[t / 32]->arrive_and_drop();
          }
          done_.arrive_and_wait();
        }
      });
  }
  ~Pool() {
    stop_ = true;
    start_.arrive_and_wait();
    for (auto& th : threads_) th.join();
  }
  template <class F>
  void run(unsigned grid, unsigned threads, F& body) {
    std::function<void()> f = [&body] { body(); };
    body_ = &f;
    active_ = threads;
    blockDim = {threads, 1, 1};
    gridDim = {grid, 1, 1};
    for (unsigned b = 0; b < grid; ++b) {
      Block blk(threads);
      block = &blk;
      block_id_ = b;
      start_.arrive_and_wait();
      done_.arrive_and_wait();
      block = nullptr;
    }
  }

 private:
  std::barrier<> start_{max_threads + 1};
  std::barrier<> done_{max_threads + 1};
  std::function<void()>* body_ = nullptr;
  unsigned active_ = 0;
  unsigned block_id_ = 0;
  bool stop_ = false;
  std::vector<std::thread> threads_;
};

/// Runs body() as grid blocks of `threads` threads (a multiple of 32, at
/// most Pool::max_threads).
template <class F>
void launch(unsigned grid, unsigned threads, F&& body) {
  static Pool pool;
  pool.run(grid, threads, body);
}

}  // namespace emu

inline void __syncthreads() { emu::block->all.arrive_and_wait(); }

template <class T>
T __shfl_xor_sync(unsigned /*mask*/, T v, int lane_mask) {
  const unsigned w = threadIdx.x / 32, l = threadIdx.x % 32;
  emu::block->buf[w][l] = static_cast<double>(v);
  emu::block->warps[w]->arrive_and_wait();
  const T r = static_cast<T>(emu::block->buf[w][l ^ static_cast<unsigned>(lane_mask)]);
  emu::block->warps[w]->arrive_and_wait();
  return r;
}

inline void __threadfence() { std::atomic_thread_fence(std::memory_order_seq_cst); }

inline unsigned atomicAdd(unsigned* p, unsigned v) { return std::atomic_ref<unsigned>(*p).fetch_add(v); }

template <class T>
T __ldcg(const T* p) {
  return *p;
}
