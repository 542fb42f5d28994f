// The emulation's block schedules (cuda_emulation.hpp): a cross-block race
// that the serial order hides fails under the shuffled and the concurrent
// ones, a kernel whose blocks meet only through a counter and fences (the
// columns pass's pattern) gives the same result under all three, and a
// misaligned vector access is reported by the launch.

#include <doctest/doctest.h>

#include <skewadam_tools/cuda_emulation.hpp>

#include <skewadam/engine/backend/cuda/kernels.cuh>

#include <numeric>
#include <stdexcept>
#include <string>
#include <vector>

namespace test_schedules_emulated {

namespace {

namespace cu = skewadam::backend::cuda;

constexpr unsigned blocks = 256;

/// Racy: block b reads what block b - 1 of the same launch writes.
__global__ void chain_kernel(int* out) {
  if (threadIdx.x != 0) return;
  const unsigned b = blockIdx.x;
  out[b] = (b == 0 ? 0 : out[b - 1]) + 1;
}

/// Right: each block writes its own partial; the last block to finish (a
/// counter, after a fence) adds them all in index order and resets the counter.
__global__ void last_block_kernel(double* partial, unsigned* done, double* total) {
  __shared__ int s_last;
  if (threadIdx.x == 0) {
    partial[blockIdx.x] = 1.0 / (1.0 + blockIdx.x);
    __threadfence();
    s_last = atomicAdd(done, 1u) == gridDim.x - 1 ? 1 : 0;
  }
  __syncthreads();
  if (!s_last) return;
  __threadfence();
  if (threadIdx.x == 0) {
    double sum = 0.0;
    for (unsigned k = 0; k < gridDim.x; ++k) sum += __ldcg(partial + k);
    *total = sum;
    *done = 0;
  }
}

__global__ void quad_kernel(const float* p, float* out) {
  if (threadIdx.x == 0) out[0] = cu::detail::load_quad(p).v[0];
}

std::vector<int> run_chain(const emu::Schedule& s) {
  const emu::ScopedSchedule use(s);
  std::vector<int> out(blocks, -1);
  emu::launch(blocks, 32, [&] { chain_kernel(out.data()); });
  return out;
}

emu::Schedule serial() { return {}; }
emu::Schedule shuffled(std::uint64_t seed) { return {.order = emu::Order::shuffled, .seed = seed}; }
emu::Schedule concurrent(unsigned threads) { return {.order = emu::Order::concurrent, .threads = threads}; }

}  // namespace

TEST_CASE("emulated schedules: a cross-block race passes in serial order and fails shuffled and concurrent") {
  std::vector<int> in_order(blocks);
  std::iota(in_order.begin(), in_order.end(), 1);
  CHECK(run_chain(serial()) == in_order);  // the serial emulation cannot see the race
  for (std::uint64_t seed : {1u, 2u, 3u}) CHECK(run_chain(shuffled(seed)) != in_order);
  for (unsigned threads : {2u, 4u}) CHECK(run_chain(concurrent(threads)) != in_order);
}

TEST_CASE("emulated schedules: blocks that meet through a counter and fences agree in every order") {
  std::vector<double> partial(blocks);
  std::vector<unsigned> done(1, 0u);
  double want = 0.0;
  for (unsigned k = 0; k < blocks; ++k) want += 1.0 / (1.0 + k);
  for (const emu::Schedule& s : {serial(), shuffled(7), concurrent(2), concurrent(4)}) {
    CAPTURE(s.str());
    const emu::ScopedSchedule use(s);
    for (int rep = 0; rep < 5; ++rep) {
      double total = -1.0;
      emu::launch(blocks, 64, [&] { last_block_kernel(partial.data(), done.data(), &total); });
      CHECK(total == want);  // bit for bit: the same terms in the same order
      CHECK(done[0] == 0u);
    }
  }
}

TEST_CASE("emulated schedules: a misaligned vector access is reported by its launch") {
  alignas(16) float data[8] = {1, 2, 3, 4, 5, 6, 7, 8};
  float out = 0.0f;
  for (const emu::Schedule& s : {serial(), concurrent(2)}) {
    const emu::ScopedSchedule use(s);
    emu::launch(1, 32, [&] { quad_kernel(data + 4, &out); });
    CHECK(out == 5.0f);
    CHECK_THROWS_WITH_AS(emu::launch(2, 32, [&] { quad_kernel(data + 1, &out); }),
                         doctest::Contains("misaligned 16-byte vector access"), std::logic_error);
    emu::launch(1, 32, [&] { quad_kernel(data, &out); });  // the report does not outlive its launch
    CHECK(out == 1.0f);
  }
}

TEST_CASE("emulated schedules: SKEWADAM_EMU_BLOCKS values") {
  CHECK(emu::Schedule::parse("serial", "X").order == emu::Order::serial);
  CHECK(emu::Schedule::parse("shuffled", "X").order == emu::Order::shuffled);
  CHECK(emu::Schedule::parse("shuffled:42", "X").seed == 42);
  CHECK(emu::Schedule::parse("concurrent:3", "X").threads == 3);
  CHECK_THROWS_WITH_AS(emu::Schedule::parse("parallel", "SKEWADAM_EMU_BLOCKS"),
                       doctest::Contains("SKEWADAM_EMU_BLOCKS=parallel: expected serial"), std::invalid_argument);
  CHECK_THROWS_WITH_AS(emu::Schedule::parse("concurrent:0", "SKEWADAM_EMU_BLOCKS"),
                       doctest::Contains("not a number in 1..64"), std::invalid_argument);
}

}  // namespace test_schedules_emulated
