// skewadam-bench: time of one optimizer step per rule, shape and dtype, with
// the bandwidth it reaches against a STREAM triad measured in the same run.
//
//   step/<tier>/<dtype>/<shape>/threads:N   one tensor (or a list) of one tier
//   model/<optimizer>/<dtype>/paper53M/threads:N
//                                           a whole step over a parameter set
//                                           with the paper's proportions
//   model/<optimizer>_checked/...           the same with the optimizer's
//                                           default non-finite gradient check
//                                           (every other benchmark runs
//                                           NonFinitePolicy::unchecked)
//   stream/triad/threads:N                  a[i] = b[i] + q * c[i], fp32
//   stream/copy/threads:N                   a[i] = b[i], fp32
//   stream/read/threads:N                   the sum of b[i], fp32 (reads only)
//   pass/<tier>/<dtype>/<shape>/<pass>/threads:N
//                                           one pass of a step alone, the
//                                           backend's own kernels and threads:
//                                           statistics (with the finalize), or
//                                           apply
//   philox/<dtype>/threads:1                the stochastic-rounding bits of a
//                                           4096x4096 tensor alone (the
//                                           kernels' generator, no memory)
//
// bytes_per_second counts the minimal memory traffic of the rule (below), not
// what the kernels happen to move, so it is directly comparable with the
// triad's (which counts 3 * 4 bytes per element: two reads, one write, as
// STREAM does, not the write-allocate read the hardware also performs).
//
// Traffic model, bytes per element (P: parameter bytes, G: gradient bytes;
// fp32 state; the O(rows + cols) factored statistics are not counted):
//   experts  factored, no momentum, clip: pass 1 reads g; pass 2 reads g, p
//            and writes p                                   2G + 2P   (f32 16, bf16 8)
//   backbone factored, momentum, clip: pass 1 reads g, m and writes m;
//            pass 2 reads m, p and writes p                 G + 12 + 2P (f32 24, bf16 18)
//   router   exact, clip: pass 1 reads g, V and writes V; pass 2 reads g,
//            V, p and writes p                              2G + 12 + 2P (f32 28, bf16 20)
//   adamw    one pass: reads g, m, V, p and writes m, V, p  G + 16 + 2P (f32 28, bf16 22)
// The pass/ rows count the same traffic split by pass (experts: G, then
// G + 2P; backbone: G + 8, then 4 + 2P).
// A rank-1 tensor under a factored tier is updated exactly: the router's model,
// or G + 24 + 2P with the backbone's momentum.
//
// Every benchmark takes the thread count as its argument (threads:1, threads:2).

#include <benchmark/benchmark.h>

#include <skewadam/skewadam.hpp>
#include <skewadam/engine/backend/cpu/cpu_backend.hpp>
#include <skewadam/engine/backend/cpu/work.hpp>

#include "bench_params.hpp"

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <new>
#include <initializer_list>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

#if defined(_OPENMP)
#include <omp.h>
#endif

namespace {

using skewadam::Dtype;
using skewadam::index_t;
using skewadam::Shape;
using skewadam::Tier;

using skewadam_bench::Kind;
using skewadam_bench::Param;
using skewadam_bench::kind_name;
using skewadam_bench::paper_model;

/// Minimal bytes moved per element by one step (the model above).
index_t bytes_per_element(Kind k, Dtype dtype, bool rank1) {
  const index_t p = skewadam::dtype_size(dtype);
  const index_t g = p;  // gradients in the parameter's dtype
  if (rank1 && (k == Kind::backbone || k == Kind::experts)) {
    // the exact fallback; the backbone keeps its momentum:
    // pass 1 reads g, m, V and writes m, V; pass 2 reads m, V, p and writes p
    return k == Kind::backbone ? g + 24 + 2 * p : 2 * g + 12 + 2 * p;
  }
  switch (k) {
    case Kind::experts: return 2 * g + 2 * p;
    case Kind::backbone: return g + 12 + 2 * p;
    case Kind::router: return 2 * g + 12 + 2 * p;
    case Kind::adamw: return g + 16 + 2 * p;
  }
  return 0;
}

/// Deterministic pseudo-random fill in [-scale, scale).
void fill(float* x, index_t n, std::uint64_t seed, float scale) {
  std::uint64_t s = seed * 0x9E3779B97F4A7C15ULL + 1;
  for (index_t i = 0; i < n; ++i) {
    s ^= s << 13;
    s ^= s >> 7;
    s ^= s << 17;
    x[i] = scale * (static_cast<float>(s >> 40) * 0x1p-23f - 1.0f);
  }
}

/// A buffer aligned to 64 bytes, as frameworks allocate tensors (PyTorch's
/// CPU allocator aligns to 64): 512-bit loads then never split cache lines.
template <class T>
struct AlignedBuffer {
  struct Free {
    void operator()(T* p) const noexcept { std::free(p); }
  };
  std::unique_ptr<T[], Free> data;
  explicit AlignedBuffer(index_t n)
      : data(static_cast<T*>(std::aligned_alloc(64, static_cast<std::size_t>((n * index_t(sizeof(T)) + 63) / 64 * 64)))) {
    if (!data) throw std::bad_alloc();
  }
  T* get() const noexcept { return data.get(); }
};

/// One tensor's parameter and gradient buffers, in fp32 or bf16.
struct Buffers {
  Dtype dtype;
  Shape shape;
  AlignedBuffer<float> p32, g32;
  AlignedBuffer<skewadam::bf16> p16, g16;

  Buffers(Dtype d, Shape s, std::uint64_t seed)
      : dtype(d), shape(s), p32(d == Dtype::f32 ? s.numel() : 1), g32(d == Dtype::f32 ? s.numel() : 1),
        p16(d == Dtype::f32 ? 1 : s.numel()), g16(d == Dtype::f32 ? 1 : s.numel()) {
    const index_t n = s.numel();
    if (d == Dtype::f32) {
      fill(p32.get(), n, seed, 0.05f);
      fill(g32.get(), n, seed + 1, 1e-3f);
    } else {
      std::vector<float> tmp(static_cast<std::size_t>(n));
      fill(tmp.data(), n, seed, 0.05f);
      for (index_t i = 0; i < n; ++i) p16.get()[i] = skewadam::bf16(tmp[static_cast<std::size_t>(i)]);
      fill(tmp.data(), n, seed + 1, 1e-3f);
      for (index_t i = 0; i < n; ++i) g16.get()[i] = skewadam::bf16(tmp[static_cast<std::size_t>(i)]);
    }
  }
  skewadam::ParamView param() {
    if (dtype == Dtype::f32) return skewadam::TensorView<float>(p32.get(), shape);
    return skewadam::TensorView<skewadam::bf16>(p16.get(), shape);
  }
  skewadam::GradView grad() {
    if (dtype == Dtype::f32) return skewadam::TensorView<const float>(g32.get(), shape);
    return skewadam::TensorView<const skewadam::bf16>(g16.get(), shape);
  }
};

const skewadam::Hyperparameters hyper{.lr = 3e-4, .weight_decay = 0.05};

/// Runs steps of `params` with the SkewAdam tiers or AdamW for all of them.
/// `checked`: the optimizer's default non-finite gradient check (nonfinite.hpp)
/// is on; otherwise NonFinitePolicy::unchecked, the update alone, as the
/// reference and torch.optim.AdamW do it.
template <class Opt>
void run_steps(benchmark::State& state, const std::vector<Param>& params, bool checked) {
  const int threads = static_cast<int>(state.range(0));
  Opt opt(hyper, skewadam::OptimizerOptions{
                     .threads = threads,
                     .nonfinite = checked ? skewadam::NonFinitePolicy::skip_step : skewadam::NonFinitePolicy::unchecked});
  std::vector<std::unique_ptr<Buffers>> buffers;
  index_t bytes = 0, elements = 0;
  std::uint64_t seed = 1;
  for (const Param& p : params) {
    buffers.push_back(std::make_unique<Buffers>(p.dtype, p.shape, seed += 2));
    const Tier tier = skewadam_bench::tier_of(p.kind);
    opt.add(p.name, tier, buffers.back()->param(), buffers.back()->grad());
    bytes += bytes_per_element(p.kind, p.dtype, p.shape.rank() < 2) * p.shape.numel();
    elements += p.shape.numel();
  }
  opt.step();  // warm-up
  for (auto _ : state) opt.step();
  state.SetBytesProcessed(static_cast<std::int64_t>(state.iterations()) * bytes);
  state.SetItemsProcessed(static_cast<std::int64_t>(state.iterations()) * elements);
  state.counters["bytes_per_elem"] = static_cast<double>(bytes) / static_cast<double>(elements);
  state.counters["elements"] = static_cast<double>(elements);
}

void step_bench(benchmark::State& state, std::vector<Param> params, bool checked) {
  if (params.front().kind == Kind::adamw) run_steps<skewadam::AdamW>(state, params, checked);
  else run_steps<skewadam::SkewAdam>(state, params, checked);
}

/// A backbone matrix's step with its momentum stored in bf16 or 8 bits
/// (SkewAdamBf16Tiers, SkewAdam8bitTiers): bytes_per_elem counts the
/// momentum as fp32 (the fp32 row's figure), so that GB/s compare.
template <class Tiers>
void stored_momentum_bench(benchmark::State& state, Param param) {
  run_steps<skewadam::Optimizer<Tiers>>(state, {param}, false);
}

/// STREAM triad over n floats: a = b + q c.
void triad(benchmark::State& state, index_t n) {
  const int threads = static_cast<int>(state.range(0));
  AlignedBuffer<float> a(n), b(n), c(n);
  fill(a.get(), n, 6, 1.0f);
  fill(b.get(), n, 7, 1.0f);
  fill(c.get(), n, 8, 1.0f);
  float* pa = a.get();
  const float* pb = b.get();
  const float* pc = c.get();
  const float q = 0.5f;
  for (auto _ : state) {
#if defined(_OPENMP)
#pragma omp parallel for num_threads(threads) schedule(static)
#endif
    for (index_t i = 0; i < n; ++i) pa[i] = pb[i] + q * pc[i];
    benchmark::DoNotOptimize(pa);
    benchmark::ClobberMemory();
  }
  (void)threads;
  state.SetBytesProcessed(static_cast<std::int64_t>(state.iterations()) * 12 * n);
  state.SetItemsProcessed(static_cast<std::int64_t>(state.iterations()) * n);
}

/// Copy over n floats: a = b (8 bytes per element counted).
void copy(benchmark::State& state, index_t n) {
  const int threads = static_cast<int>(state.range(0));
  AlignedBuffer<float> a(n), b(n);
  fill(a.get(), n, 6, 1.0f);
  fill(b.get(), n, 7, 1.0f);
  float* pa = a.get();
  const float* pb = b.get();
  for (auto _ : state) {
#if defined(_OPENMP)
#pragma omp parallel for num_threads(threads) schedule(static)
#endif
    for (index_t i = 0; i < n; ++i) pa[i] = pb[i];
    benchmark::DoNotOptimize(pa);
    benchmark::ClobberMemory();
  }
  (void)threads;
  state.SetBytesProcessed(static_cast<std::int64_t>(state.iterations()) * 8 * n);
  state.SetItemsProcessed(static_cast<std::int64_t>(state.iterations()) * n);
}

/// Read over n floats: their sum (4 bytes per element counted): what bounds
/// a pass that only reads, such as the expert tier's statistics.
void read(benchmark::State& state, index_t n) {
  const int threads = static_cast<int>(state.range(0));
  AlignedBuffer<float> b(n);
  fill(b.get(), n, 7, 1.0f);
  const float* pb = b.get();
  for (auto _ : state) {
    float sum = 0.0f;
#if defined(_OPENMP)
#pragma omp parallel for simd num_threads(threads) schedule(static) reduction(+ : sum)
#endif
    for (index_t i = 0; i < n; ++i) sum += pb[i];
    benchmark::DoNotOptimize(sum);
  }
  (void)threads;
  state.SetBytesProcessed(static_cast<std::int64_t>(state.iterations()) * 4 * n);
  state.SetItemsProcessed(static_cast<std::int64_t>(state.iterations()) * n);
}

/// One pass of one tensor's step alone, through the backend's own threads:
/// statistics (with the finalize) or apply (after one full step, so that the
/// apply pass has its statistics).
template <class Rule, class T>
void pass_run(benchmark::State& state, Kind kind, Shape shape, bool apply) {
  namespace be = skewadam::backend;
  using M = typename Rule::momentum;
  using S = typename Rule::second_moment;
  const int threads = static_cast<int>(state.range(0));
  const Dtype dtype = skewadam::dtype_of<T>();
  Buffers buf(dtype, shape, 3);
  const index_t n = shape.numel();
  const skewadam::MatrixGeometry g = shape.matrices();
  const bool factored = S::factored && shape.rank() >= 2;
  std::vector<float> m(M::has_state ? static_cast<std::size_t>(n) : 0), v(factored ? 0 : static_cast<std::size_t>(n));
  std::vector<float> v_row(static_cast<std::size_t>(g.batch * g.rows)), v_col(static_cast<std::size_t>(g.batch * g.cols));
  std::vector<float> col_partial(static_cast<std::size_t>(be::Cutting::partial_floats(g)));
  std::vector<float> d_partial(col_partial.size());
  std::vector<be::MatrixScratch> matrices(static_cast<std::size_t>(g.batch));
  const index_t chunks = be::Cutting::chunks_per_matrix(g);
  std::vector<double> unit_sum(static_cast<std::size_t>(g.batch * chunks));
  be::CpuBackend<> backend;
  backend.set_threads(threads);
  be::TensorTask t;
  t.param = dtype == Dtype::f32 ? static_cast<void*>(buf.p32.get()) : static_cast<void*>(buf.p16.get());
  t.grad = dtype == Dtype::f32 ? static_cast<const void*>(buf.g32.get()) : static_cast<const void*>(buf.g16.get());
  t.geom = g;
  t.factored = factored;
  t.scalars = skewadam::make_step_scalars(hyper, 1);
  t.key = skewadam::RoundingKey{1, skewadam::tensor_id("w"), 1};
  t.m = m.empty() ? nullptr : m.data();
  t.v = v.empty() ? nullptr : v.data();
  t.v_row = v_row.data();
  t.v_col = v_col.data();
  t.matrices = matrices.data();
  t.col_partial = col_partial.empty() ? nullptr : col_partial.data();
  t.d_partial = d_partial.empty() ? nullptr : d_partial.data();
  t.unit_sum = unit_sum.data();
  t.row_blocks = factored ? be::Cutting::row_blocks(g) : 1;
  t.chunks_per_matrix = chunks;
  // The kernel table's passes alone: statistics and their finalize, or the
  // update alone (it reads only the task's own state and scratch).
  const be::KernelTable* full = backend.kernels<Rule, T, T>();
  const be::KernelTable statistics_only{full->statistics, full->finalize, nullptr, full->finish_cut};
  const be::KernelTable apply_only{[](const be::TensorTask&, const be::WorkUnit&, be::Scratch) {},
                                   [](const be::TensorTask&, be::Scratch) {}, full->apply, nullptr};
  t.kernel = full;
  backend.run({&t, 1});  // warm-up, and the statistics the apply pass uses
  t.kernel = apply ? &apply_only : &statistics_only;
  for (auto _ : state) backend.run({&t, 1});
  const index_t p = skewadam::dtype_size(dtype);
  index_t bytes = 0;
  switch (kind) {
    case Kind::experts: bytes = apply ? 2 * p + p : p; break;
    case Kind::backbone: bytes = apply ? 4 + 2 * p : p + 8; break;
    default: bytes = bytes_per_element(kind, dtype, false); break;
  }
  state.SetBytesProcessed(static_cast<std::int64_t>(state.iterations()) * bytes * n);
  state.SetItemsProcessed(static_cast<std::int64_t>(state.iterations()) * n);
  state.counters["bytes_per_elem"] = static_cast<double>(bytes);
}

void pass_bench(benchmark::State& state, Kind kind, Dtype dtype, Shape shape, bool apply) {
  auto go = [&]<class T>() {
    switch (kind) {
      case Kind::experts: return pass_run<skewadam::ExpertRule, T>(state, kind, shape, apply);
      case Kind::backbone: return pass_run<skewadam::BackboneRule, T>(state, kind, shape, apply);
      case Kind::router: return pass_run<skewadam::RouterRule, T>(state, kind, shape, apply);
      case Kind::adamw: return pass_run<skewadam::AdamWRule, T>(state, kind, shape, apply);
    }
  };
  if (dtype == Dtype::f32) go.template operator()<float>();
  else go.template operator()<skewadam::bf16>();
}

/// The stochastic-rounding bits of n elements, one vector of bits at a time
/// as the kernels read them (the generator alone).
void philox(benchmark::State& state, index_t n) {
  namespace cpu = skewadam::backend::cpu;
  const skewadam::RoundingKey key{1, skewadam::tensor_id("w"), 1};
  cpu::visit_arch(cpu::selected_arch(), [&]<class A>() {
    using V = cpu::vec_t<A>;
    using Rng = std::conditional_t<std::is_same_v<A, skewadam::ScalarArch>, skewadam::RandomStream, cpu::RandomWindow<A>>;
    constexpr index_t w = cpu::width_v<V>;
    for (auto _ : state) {
      Rng rng(key);
      std::uint32_t x = 0;
      for (index_t e = 0; e < n; e += w) {
        if constexpr (std::is_same_v<A, skewadam::ScalarArch>) x ^= rng(e);
        else x ^= *rng.at(e, w);
      }
      benchmark::DoNotOptimize(x);
    }
  });
  state.SetItemsProcessed(static_cast<std::int64_t>(state.iterations()) * n);
}

/// Concatenation by append (GCC 12 warns falsely on some operator+ chains).
std::string join(std::initializer_list<std::string_view> parts) {
  std::string out;
  for (std::string_view p : parts) out.append(p);
  return out;
}

std::string shape_name(const Shape& s) {
  std::string out;
  for (int i = 0; i < s.rank(); ++i) {
    if (i) out.push_back('x');
    out.append(std::to_string(s[i]));
  }
  return out;
}

void add(const std::string& name, std::vector<Param> params, bool checked = false) {
  benchmark::RegisterBenchmark(name.c_str(), step_bench, std::move(params), checked)
      ->ArgName("threads")
      ->Arg(1)
      ->Arg(2)
      ->UseRealTime()
      ->Unit(benchmark::kMillisecond);
}

void register_all() {
  const index_t triad_n = index_t{4096} * 4096;
  benchmark::RegisterBenchmark("stream/triad", triad, triad_n)
      ->ArgName("threads")
      ->Arg(1)
      ->Arg(2)
      ->UseRealTime()
      ->Unit(benchmark::kMillisecond);

  benchmark::RegisterBenchmark("stream/copy", copy, triad_n)
      ->ArgName("threads")
      ->Arg(1)
      ->Arg(2)
      ->UseRealTime()
      ->Unit(benchmark::kMillisecond);
  benchmark::RegisterBenchmark("stream/read", read, triad_n)
      ->ArgName("threads")
      ->Arg(1)
      ->Arg(2)
      ->UseRealTime()
      ->Unit(benchmark::kMillisecond);
  benchmark::RegisterBenchmark("philox/bf16/4096x4096", philox, triad_n)
      ->ArgName("threads")
      ->Arg(1)
      ->UseRealTime()
      ->Unit(benchmark::kMillisecond);
  for (Dtype dtype : {Dtype::f32, Dtype::bf16})
    for (Kind kind : {Kind::experts, Kind::backbone})
      for (bool apply : {false, true})
        benchmark::RegisterBenchmark(join({"pass/", kind_name(kind), "/", skewadam::dtype_name(dtype), "/4096x4096/",
                                           apply ? "apply" : "statistics"})
                                         .c_str(),
                                     pass_bench, kind, dtype, Shape{4096, 4096}, apply)
            ->ArgName("threads")
            ->Arg(1)
            ->Arg(2)
            ->UseRealTime()
            ->Unit(benchmark::kMillisecond);

  struct One {
    Kind kind;
    Shape shape;
  };
  const std::vector<One> singles = {
      {Kind::router, Shape{128, 4096}},       {Kind::experts, Shape{4096, 2048}},
      {Kind::experts, Shape{4096, 4096}},     {Kind::experts, Shape{8, 1024, 2048}},
      {Kind::backbone, Shape{4096, 4096}},    {Kind::adamw, Shape{4096, 2048}},
      {Kind::adamw, Shape{4096, 4096}},
  };
  for (Dtype dtype : {Dtype::f32, Dtype::bf16})
    for (const One& o : singles)
      add(join({"step/", kind_name(o.kind), "/", skewadam::dtype_name(dtype), "/", shape_name(o.shape)}),
          {Param{"w", o.kind, o.shape, dtype}});

  // The backbone's matrix with its momentum stored in bf16 or in 8 bits.
  for (Dtype dtype : {Dtype::f32, Dtype::bf16}) {
    const std::string shape = shape_name(Shape{4096, 4096});
    const Param w{"w", Kind::backbone, Shape{4096, 4096}, dtype};
    for (const auto& [name, run] :
         {std::pair{"bf16_momentum", &stored_momentum_bench<skewadam::SkewAdamBf16Tiers>},
          std::pair{"8bit_momentum", &stored_momentum_bench<skewadam::SkewAdam8bitTiers>}})
      benchmark::RegisterBenchmark(
          join({"step/backbone_", name, "/", skewadam::dtype_name(dtype), "/", shape}).c_str(), run, w)
          ->ArgName("threads")
          ->Arg(1)
          ->Arg(2)
          ->UseRealTime()
          ->Unit(benchmark::kMillisecond);
  }

  // Many small tensors in one step: 64 matrices [64, 256] and 64 vectors [256].
  for (Dtype dtype : {Dtype::f32, Dtype::bf16}) {
    std::vector<Param> small;
    for (int i = 0; i < 64; ++i) {
      const std::string k = std::to_string(i);
      small.push_back({join({"m", k}), Kind::backbone, Shape{64, 256}, dtype});
      small.push_back({join({"v", k}), Kind::backbone, Shape{256}, dtype});
    }
    add(join({"step/backbone/", skewadam::dtype_name(dtype), "/128tensors_64x256_256"}), small);
  }

  for (Dtype dtype : {Dtype::f32, Dtype::bf16}) {
    const std::string_view dt = skewadam::dtype_name(dtype);
    add(join({"model/skewadam/", dt, "/paper53M"}), paper_model(dtype, false));
    add(join({"model/adamw/", dt, "/paper53M"}), paper_model(dtype, true));
  }
  // The same steps with the optimizer's default non-finite gradient check.
  for (Dtype dtype : {Dtype::f32, Dtype::bf16}) {
    const std::string_view dt = skewadam::dtype_name(dtype);
    add(join({"model/skewadam_checked/", dt, "/paper53M"}), paper_model(dtype, false), true);
    add(join({"model/adamw_checked/", dt, "/paper53M"}), paper_model(dtype, true), true);
  }
}

}  // namespace

int main(int argc, char** argv) {
  register_all();
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  benchmark::AddCustomContext("skewadam.arch", skewadam::backend::DefaultBackend::arch_name());
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
