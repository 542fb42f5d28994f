// The optimizer front-end over the CUDA backend and the CUDA runtime
// (skewadam/cuda.cuh), on a GPU: every golden case, a non-finite gradient
// skipped with its report, clipping, checkpoint round trips through the
// file format, a step captured in a CUDA graph and replayed, Eigen maps of
// device memory, host memory refused, memory from a stream-ordered allocator
// of the caller's, a missing device refused. The same engine runs the whole
// contract suite on the host through the emulated runtime
// (tests/emulation/test_contract_cuda_emulated.cpp); this program checks the
// runtime's part. Without a CUDA device it exits 77 (skipped).

#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <limits>
#include <map>
#include <string>
#include <vector>

#include <skewadam/engine/backend/cuda/device_buffer.cuh>
#include <skewadam/checkpoint.hpp>
#include <skewadam/cuda.cuh>
#include <skewadam/eigen_view.hpp>
#include <skewadam_tools/golden_case.hpp>

#include "../support/device_floats.hpp"
#include "../support/golden_dirs.hpp"

namespace {

using namespace skewadam;
namespace cu = backend::cuda;

template <class Tiers = SkewAdamTiers>
using GpuOptimizer = Optimizer<Tiers, cuda::Backend>;

/// Floats of device memory, copied in stream order (device_floats.hpp): on
/// the legacy stream, or on the stream of the optimizer that reads them.
using DeviceFloats = test::DeviceFloats<cu::DeviceRuntime>;

}  // namespace

TEST_CASE("front-end on the GPU: every golden case") {
  const auto cases = test::golden_cases();
  REQUIRE(!cases.empty());
  for (const auto& dir : cases) {
    INFO("case ", dir.string());
    const tools::GoldenCase c = tools::load_golden_case(dir);
    tools::CaseRun run = tools::with_case_rule(c, [&]<class Rule>() {
      GpuOptimizer<TierRules<Rule, Rule, Rule>> opt(c.hyper, c.options());
      const Shape shape = c.tensor_shape();
      const index_t n = shape.numel();
      tools::TypedValues host = c.initial_param();  // the parameter's values, read back after every step
      const tools::TypedValues grads = c.typed_grads();
      const auto param_bytes = static_cast<std::size_t>(n * dtype_size(c.param_dtype));
      const auto grad_bytes = static_cast<std::size_t>(n * dtype_size(c.grad_dtype));
      cu::DeviceBuffer<std::uint8_t> p(param_bytes), g(grad_bytes);
      cu::check(cudaMemcpy(p.data(), host.data(), param_bytes, cudaMemcpyHostToDevice), "cudaMemcpy");
      ParamView param = host.param_view(0, shape);  // the same dtype and shape, in device memory
      param.data = p.data();
      GradView grad = grads.grad_view(0, shape);
      grad.data = g.data();
      const ParamId id = opt.add(c.param_name, Tier::backbone, param);
      tools::CaseRun r;
      r.params.resize(static_cast<std::size_t>(c.steps * n));
      for (std::int64_t t = 0; t < c.steps; ++t) {
        cu::check(cudaMemcpy(g.data(), grads.data(t * n), grad_bytes, cudaMemcpyHostToDevice), "cudaMemcpy");
        opt.set_grad(id, grad);
        opt.set_lr(c.lr_schedule[static_cast<std::size_t>(t)]);
        opt.step();
        CHECK(opt.last_step().applied);
        cu::check(cudaMemcpy(host.data(), p.data(), param_bytes, cudaMemcpyDeviceToHost), "cudaMemcpy");
        host.widen(0, n, r.params.data() + t * n);
      }
      tools::collect_state(c, opt, id, r);
      return r;
    });
    for (const tools::ArrayCheck& a : tools::check_golden_case(c, run)) {
      INFO(a.array, ": worst error ", a.worst, " of the tolerance ", a.problem, a.detail);
      CHECK(a.ok);
    }
  }
}

TEST_CASE("front-end on the GPU: a non-finite gradient skips the step and names the element") {
  GpuOptimizer<> opt(Hyperparameters{.lr = 1e-2});
  std::vector<float> w(300 * 257, 0.5f), gw(w.size(), 0.01f);
  DeviceFloats p(w), g(gw);
  const ParamId id = opt.add("w", Tier::backbone, TensorView<float>(p.d.data(), {300, 257}),
                             TensorView<const float>(g.d.data(), {300, 257}));
  opt.step();
  CHECK(opt.last_step().applied);
  const OptimizerState before = opt.export_state();
  const std::vector<float> p_before = p.get();
  gw[1234] = std::numeric_limits<float>::infinity();
  g.put(gw);
  opt.step();
  const StepReport r = opt.last_step();
  CHECK_FALSE(r.applied);
  REQUIRE(r.nonfinite.has_value());
  CHECK(r.nonfinite->element == 1234);
  CHECK(r.nonfinite->param == id);
  CHECK(p.get() == p_before);
  CHECK(opt.export_state().params[0].state.v_row == before.params[0].state.v_row);
  CHECK(opt.steps() == 1);
}

TEST_CASE("sharded on the GPU, one rank: the local engine's bits, through a sharded checkpoint") {
  // a backbone matrix, an expert bank, a router, a bias: every tensor owned whole
  struct T {
    const char* name;
    Tier tier;
    Shape shape;
  };
  const std::vector<T> model = {{"w", Tier::backbone, Shape{96, 64}}, {"bank", Tier::experts, Shape{4, 16, 24}},
                                {"router", Tier::router, Shape{4, 64}}, {"bias", Tier::backbone, Shape{64}}};
  dist::SelfCommunicator self;
  cuda::ShardedOptimizer<SkewAdamTiers, dist::SelfCommunicator> sharded(self, Hyperparameters{.lr = 1e-2});
  GpuOptimizer<> local(Hyperparameters{.lr = 1e-2});
  std::vector<DeviceFloats> ps, qs, gs;
  for (std::size_t k = 0; k < model.size(); ++k) {
    std::vector<float> w(static_cast<std::size_t>(model[k].shape.numel())), g(w.size());
    for (std::size_t i = 0; i < w.size(); ++i) {
      w[i] = 0.01f * static_cast<float>((i * 7 + k) % 23) - 0.1f;
      g[i] = (i % 2 ? 3.0f : 0.01f) * (0.01f * static_cast<float>((i * 13 + k) % 19) - 0.09f);
    }
    ps.emplace_back(w);
    qs.emplace_back(w);
    gs.emplace_back(g);
  }
  for (std::size_t k = 0; k < model.size(); ++k) {
    const T& t = model[k];
    sharded.add(t.name, t.tier, TensorView<float>(ps[k].d.data(), t.shape),
                TensorView<const float>(gs[k].d.data(), t.shape));
    local.add(t.name, t.tier, TensorView<float>(qs[k].d.data(), t.shape),
              TensorView<const float>(gs[k].d.data(), t.shape));
  }
  for (int t = 0; t < 4; ++t) {
    sharded.step();
    CHECK(sharded.last_step().applied);
    local.step();
  }
  for (std::size_t k = 0; k < model.size(); ++k) CHECK(ps[k].get() == qs[k].get());
  const OptimizerState a = sharded.export_state(), b = local.export_state();
  for (std::size_t k = 0; k < model.size(); ++k) {
    CHECK(a.params[k].state.v_row == b.params[k].state.v_row);
    CHECK(a.params[k].state.v_col == b.params[k].state.v_col);
    CHECK(a.params[k].state.v == b.params[k].state.v);
    CHECK(a.params[k].state.m == b.params[k].state.m);
  }
  const std::filesystem::path file = std::filesystem::temp_directory_path() / "skewadam-gpu-sharded.ckpt";
  save_checkpoint(sharded, file);
  GpuOptimizer<> resumed(Hyperparameters{.lr = 1e-2});
  for (std::size_t k = 0; k < model.size(); ++k)
    resumed.add(model[k].name, model[k].tier, TensorView<float>(qs[k].d.data(), model[k].shape));
  load_checkpoint(resumed, file);
  CHECK(resumed.steps() == 4);
  CHECK(resumed.export_state().params[1].state.v_col == a.params[1].state.v_col);
  std::filesystem::remove(file);
}

TEST_CASE("front-end on the GPU: a checkpoint loads into the CPU format and back") {
  std::vector<float> w(64 * 48, 0.25f), gw(w.size(), 0.02f);
  DeviceFloats p(w), g(gw);
  GpuOptimizer<> a(Hyperparameters{.lr = 1e-2});
  a.add("e", Tier::experts, TensorView<float>(p.d.data(), {64, 48}), TensorView<const float>(g.d.data(), {64, 48}));
  for (int t = 0; t < 3; ++t) a.step();
  CHECK(a.clip_grad_norm(0.1) > 0.0);
  a.step();
  const std::vector<std::byte> bytes = checkpoint_bytes(a);
  GpuOptimizer<> b(Hyperparameters{.lr = 1e-2});
  DeviceFloats q(w);
  b.add("e", Tier::experts, TensorView<float>(q.d.data(), {64, 48}));
  load_checkpoint(b, bytes);
  CHECK(b.steps() == 4);
  CHECK(b.export_state().params[0].state.v_col == a.export_state().params[0].state.v_col);
}

TEST_CASE("front-end on the GPU: a captured step replays as ordinary steps do, counts and skips included") {
  cudaStream_t s = nullptr;
  cu::check(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), "cudaStreamCreate");
  {
    std::vector<float> w(300 * 257, 0.5f), gw(w.size(), 0.01f);
    DeviceFloats p1(w, s), p2(w, s), g(gw, s);  // uploaded on the optimizers' stream
    GpuOptimizer<> stepped(Hyperparameters{.lr = 1e-2}, {.stream = s});
    GpuOptimizer<> replayed(Hyperparameters{.lr = 1e-2}, {.stream = s});
    const TensorView<const float> gv(g.d.data(), {300, 257});
    stepped.add("w", Tier::backbone, TensorView<float>(p1.d.data(), {300, 257}), gv);
    replayed.add("w", Tier::backbone, TensorView<float>(p2.d.data(), {300, 257}), gv);
    const auto graph = replayed.capture_step();
    CHECK(replayed.steps() == 0);
    for (int t = 1; t <= 4; ++t) {
      for (std::size_t i = 0; i < gw.size(); ++i) gw[i] = 0.01f * static_cast<float>((i * 7 + t) % 13) - 0.06f;
      if (t == 3) gw[77] = std::numeric_limits<float>::quiet_NaN();
      g.put(gw);  // in stream order after the last replay (which reads the gradient)
      if (t == 2) {
        replayed.set_lr(5e-3);
        stepped.set_lr(5e-3);
      }
      stepped.step();
      replayed.replay(graph);
      CHECK(replayed.last_step().applied == (t != 3));
      CHECK(p2.get() == p1.get());
    }
    CHECK(replayed.steps() == 3);
    CHECK(replayed.export_state().params[0].state.v_row == stepped.export_state().params[0].state.v_row);
  }
  cu::check(cudaStreamDestroy(s), "cudaStreamDestroy");
}

TEST_CASE("front-end on the GPU: Eigen maps of device memory register as any view does") {
  using Matrix = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
  std::vector<float> w(32 * 16, 0.5f), gw(w.size(), 0.01f);
  DeviceFloats p(w), q(w), g(gw);
  Eigen::Map<Matrix> pm(p.d.data(), 32, 16);
  Eigen::Map<const Matrix> gm(g.d.data(), 32, 16);
  GpuOptimizer<> mapped(Hyperparameters{.lr = 1e-2});
  GpuOptimizer<> viewed(Hyperparameters{.lr = 1e-2});
  mapped.add("w", Tier::backbone, eigen_view(pm), eigen_view(gm));
  viewed.add("w", Tier::backbone, TensorView<float>(q.d.data(), {32, 16}), TensorView<const float>(g.d.data(), {32, 16}));
  for (int t = 0; t < 3; ++t) {
    mapped.step();
    viewed.step();
  }
  mapped.synchronize();
  viewed.synchronize();
  CHECK(p.get() == q.get());
  CHECK(mapped.steps() == 3);
}

TEST_CASE("front-end on the GPU: host memory is refused, naming the parameter") {
  GpuOptimizer<> opt;
  std::vector<float> host(16);
  try {
    opt.add("w", Tier::experts, TensorView<float>(host.data(), {4, 4}));
    FAIL("host memory was accepted");
  } catch (const std::invalid_argument& e) {
    CHECK(std::string(e.what()).find("param of 'w'") != std::string::npos);
  }
  CHECK(opt.size() == 0);
}

TEST_CASE("front-end on the GPU: memory from a stream-ordered allocator of the caller's, all of it given back") {
  struct Pool {
    cudaStream_t stream = nullptr;
    std::map<void*, std::size_t> held;
  };
  Pool pool;
  cu::check(cudaStreamCreateWithFlags(&pool.stream, cudaStreamNonBlocking), "cudaStreamCreate");
  DeviceAllocator from;
  from.allocate = [](std::size_t bytes, void* c) -> void* {
    auto& p = *static_cast<Pool*>(c);
    void* q = nullptr;
    if (cudaMallocAsync(&q, bytes, p.stream) != cudaSuccess) return nullptr;
    p.held[q] = bytes;
    return q;
  };
  from.release = [](void* q, void* c) noexcept {
    auto& p = *static_cast<Pool*>(c);
    p.held.erase(q);
    (void)cudaFreeAsync(q, p.stream);
  };
  from.context = &pool;
  {
    std::vector<float> w(300 * 257, 0.5f), gw(w.size(), 0.01f);
    DeviceFloats p1(w, pool.stream), p2(w), g1(gw, pool.stream), g2(gw);
    GpuOptimizer<> pooled(Hyperparameters{.lr = 1e-2}, {.stream = pool.stream, .device_allocator = from});
    GpuOptimizer<> plain(Hyperparameters{.lr = 1e-2});
    CHECK(pooled.engine().backend().device() == cu::DeviceRuntime::current_device());
    pooled.add("w", Tier::backbone, TensorView<float>(p1.d.data(), {300, 257}),
               TensorView<const float>(g1.d.data(), {300, 257}));
    plain.add("w", Tier::backbone, TensorView<float>(p2.d.data(), {300, 257}),
              TensorView<const float>(g2.d.data(), {300, 257}));
    std::size_t bytes = 0;
    for (const auto& [q, n] : pool.held) bytes += n;
    CHECK(bytes == static_cast<std::size_t>(pooled.device_bytes()));
    for (int t = 0; t < 3; ++t) {
      pooled.step();
      plain.step();
    }
    CHECK(p1.get() == p2.get());
    CHECK(pooled.steps() == 3);
  }
  CHECK(pool.held.empty());
  cu::check(cudaStreamSynchronize(pool.stream), "cudaStreamSynchronize");
  cu::check(cudaStreamDestroy(pool.stream), "cudaStreamDestroy");
}

TEST_CASE("front-end on the GPU: a device that is not there is refused, and the caller's device stays current") {
  const int before = cu::DeviceRuntime::current_device();
  try {
    GpuOptimizer<> opt(Hyperparameters{}, {.device = cu::device_count()});
    FAIL("a device that does not exist was accepted");
  } catch (const std::invalid_argument& e) {
    CHECK(std::string(e.what()).find("device: " + std::to_string(cu::device_count())) != std::string::npos);
  }
  CHECK(cu::DeviceRuntime::current_device() == before);
}

int main(int argc, char** argv) {
  if (cu::device_count() == 0) {
    std::puts("no CUDA device: skipped");
    return 77;
  }
  doctest::Context ctx(argc, argv);
  return ctx.run();
}
