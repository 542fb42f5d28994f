// Stream order on the emulated runtime (emulated_runtime.hpp): a copy on
// one stream is not seen by a kernel on another until the host waits for it,
// as on a GPU; so the runs of the GPU tests (skewadam_tools/cuda_steps.hpp,
// every copy on the optimizer's stream) are checked here against the CPU
// backend, and the pattern they had before (gradients copied on the legacy
// stream, steps on a non-blocking one) fails here.

#include <doctest/doctest.h>

#include <skewadam_tools/emulated_runtime.hpp>

#include <cstdint>
#include <cstring>
#include <vector>

#include <skewadam/engine/backend/cuda/device_memory.hpp>
#include <skewadam/skewadam.hpp>
#include <skewadam_tools/cuda_steps.hpp>

#include "cuda_run_reference.hpp"
#include "device_floats.hpp"

namespace test_streams_emulated {

namespace {

using namespace skewadam;
using R = emu::Runtime;
using Floats = test::DeviceFloats<R>;
namespace gpu = skewadam::tools::cuda;

void* const stream_a = reinterpret_cast<void*>(std::uintptr_t{0x5a});
void* const stream_b = reinterpret_cast<void*>(std::uintptr_t{0x5b});

template <int = 0>
__global__ void twice_kernel(const float* in, float* out, index_t n) {
  const index_t i = static_cast<index_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < n) out[i] = 2.0f * in[i];
}

/// out = 2 in, launched on stream s.
void twice(const Floats& in, Floats& out, void* s) {
  const auto n = static_cast<index_t>(in.d.size());
  R::launch<&twice_kernel<>>(static_cast<unsigned>((n + 63) / 64), 64u, s, static_cast<const float*>(in.d.data()),
                             out.d.data(), n);
}

}  // namespace

TEST_CASE("emulated streams: a copy on another stream reaches a kernel only once the host has waited for it") {
  const std::vector<float> zeros(300, 0.0f), values(300, 1.5f), doubled(300, 3.0f);
  Floats in(zeros, stream_b), out(zeros, stream_a);
  R::synchronize(stream_b);
  R::synchronize(stream_a);
  in.put(values);  // on stream b, not waited for
  CHECK(std::memcmp(in.d.data(), values.data(), 300 * sizeof(float)) == 0);  // the host sees it at once
  twice(in, out, stream_a);
  CHECK(out.get() == zeros);  // a kernel on stream a does not
  CHECK(R::unsynchronized() == 1);
  twice(in, out, stream_b);   // one on stream b, after the copy in its order, does
  R::synchronize(stream_b);
  CHECK(out.get() == doubled);
  CHECK(R::unsynchronized() == 0);
  out.put(zeros);
  R::synchronize(stream_a);
  twice(in, out, stream_a);   // and, once the host has waited, every stream
  CHECK(out.get() == doubled);
}

TEST_CASE("emulated streams: DeviceMemory::clear is done when it returns, a zeroing alone is not") {
  using Mem = backend::cuda::DeviceMemory<R>;
  const std::vector<float> ones(100, 1.0f), zeros(100, 0.0f), twos(100, 2.0f);
  Floats a(ones, stream_a), out(zeros, stream_a);
  R::synchronize(stream_a);
  R::zero(a.d.data(), a.d.bytes(), nullptr);  // on the default stream, not waited for
  twice(a, out, stream_a);
  CHECK(out.get() == twos);
  Mem::clear(a.d.data(), a.d.bytes());  // DeviceBuffer::zero()'s
  twice(a, out, stream_a);
  CHECK(out.get() == zeros);
}

TEST_CASE("emulated streams: the GPU tests' runs, every copy on the optimizer's stream, give the CPU backend's bits") {
  // bf16 with stochastic rounding and exact sums (k/64 gradients, the clip
  // not binding), as tests/cuda/test_cuda.cpp's parity test: any order of
  // the reductions gives the same bits, stale data would not
  const std::vector<std::vector<std::int64_t>> shapes = {{3, 70, 129}, {300, 257}, {1000}};
  for (gpu::RuleKind rule : {gpu::RuleKind::backbone, gpu::RuleKind::experts, gpu::RuleKind::router})
    for (const auto& shape : shapes)
      for (bool graph : {false, true}) {
        std::int64_t n = 1;
        for (auto d : shape) n *= d;
        const std::int64_t steps = 4;
        test::Rng rng(static_cast<std::uint64_t>(n) * 7 + static_cast<std::uint64_t>(rule));
        std::vector<bf16> p0(static_cast<std::size_t>(n)), g(static_cast<std::size_t>(n * steps));
        for (auto& x : p0) x = bf16(rng.uniform(-0.05f, 0.05f));
        for (auto& x : g) x = bf16(static_cast<float>(rng.integer(-31, 31)) / 64.0f);
        gpu::RunSpec s;
        s.rule = rule;
        s.name = "blocks.0.w";
        s.shape = shape;
        s.dtype = Dtype::bf16;
        s.hyper = Hyperparameters{.lr = 1e-3, .weight_decay = 0.05, .clip_threshold = 1000.0};
        s.lr = {1e-3, 2e-3, 5e-4, 1e-3};
        s.steps = steps;
        s.param0 = p0.data();
        s.grads = g.data();
        s.graph = graph;
        CAPTURE(test::rule_name(rule));
        CAPTURE(n);
        CAPTURE(graph);
        const gpu::RunResult want = test::run_cpu<bf16>(s);
        const gpu::RunResult got = gpu::run_steps<R>(s, stream_a);
        CHECK(got.params == want.params);
        CHECK(got.state.v_row == want.state.v_row);
        CHECK(got.state.v_col == want.state.v_col);
        CHECK(got.state.v == want.state.v);
        CHECK(R::unsynchronized() == 0);
      }
}

TEST_CASE("emulated streams: gradients copied on the default stream, steps on another: stale, as on a GPU") {
  const Shape shape{64, 48};
  std::vector<float> w(64 * 48), zeros(w.size(), 0.0f);
  std::vector<std::vector<float>> grads(3, std::vector<float>(w.size()));
  for (std::size_t i = 0; i < w.size(); ++i) {
    w[i] = 0.01f * static_cast<float>(i % 17) - 0.08f;
    for (std::size_t t = 0; t < grads.size(); ++t) grads[t][i] = 0.001f * static_cast<float>((i * 7 + t) % 13) - 0.006f;
  }
  auto run = [&](void* upload_stream) {
    Optimizer<SkewAdamTiers, tools::EmulatedCuda> opt(Hyperparameters{.lr = 1e-2}, {.stream = stream_a});
    Floats p(w, stream_a), g(zeros, stream_a);
    const ParamId id = opt.add("e", Tier::experts, TensorView<float>(p.d.data(), shape),
                               TensorView<const float>(g.d.data(), shape));
    std::vector<float> after;
    for (const auto& gt : grads) {
      g.stream = upload_stream;
      g.put(gt);
      opt.step();
      after = p.get();
    }
    (void)id;
    R::synchronize(nullptr);
    return after;
  };
  Optimizer<SkewAdamTiers> cpu(Hyperparameters{.lr = 1e-2});
  std::vector<float> q = w, gq(w.size());
  cpu.add("e", Tier::experts, TensorView<float>(q.data(), shape), TensorView<const float>(gq.data(), shape));
  for (const auto& gt : grads) {
    gq = gt;
    cpu.step();
  }
  const std::vector<float> ordered = run(stream_a), racy = run(nullptr);
  double worst = 0;
  for (std::size_t i = 0; i < q.size(); ++i) worst = std::max(worst, std::abs(double(ordered[i]) - double(q[i])));
  CHECK(worst < 1e-6);  // on the step's stream: the CPU backend's steps
  CHECK(racy != ordered);  // on the default stream: the steps read stale (zero) gradients
}

}  // namespace test_streams_emulated
