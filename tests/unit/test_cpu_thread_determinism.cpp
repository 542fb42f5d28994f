// A multi-tensor step gives the same bits with 1, 2 and 3 threads: the work is
// cut by shape only (engine/backend/cpu/work.hpp) and partial sums are combined in a
// fixed order. The tensors cover every tier, bf16 / fp16 / fp32 parameters
// (stochastic rounding on), a stacked bank, a matrix split into row blocks, an
// element-wise tensor split into chunks, a zero row and rows where the eps
// floor binds.

#include <doctest/doctest.h>

#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include <skewadam/skewadam.hpp>

namespace test_cpu_thread_determinism {

namespace {

using namespace skewadam;

struct Spec {
  std::string name;
  Tier tier;
  Shape shape;
  Dtype param;
  Dtype grad;
};

std::vector<Spec> specs() {
  return {
      {"bank", Tier::experts, Shape{4, 96, 70}, Dtype::bf16, Dtype::bf16},
      {"experts.big", Tier::experts, Shape{2000, 260}, Dtype::f32, Dtype::f32},  // 2 row blocks
      {"backbone.w", Tier::backbone, Shape{513, 257}, Dtype::bf16, Dtype::bf16},
      {"backbone.blocks", Tier::backbone, Shape{1100, 300}, Dtype::bf16, Dtype::f32},  // 2 row blocks
      {"backbone.norm", Tier::backbone, Shape{1000}, Dtype::bf16, Dtype::bf16},
      {"backbone.half", Tier::backbone, Shape{64, 48}, Dtype::f16, Dtype::f32},
      {"router", Tier::router, Shape{300, 500}, Dtype::f32, Dtype::f32},  // 3 chunks
  };
}

std::uint64_t mix(std::uint64_t x) {
  x ^= x >> 33;
  x *= 0xff51afd7ed558ccdULL;
  x ^= x >> 33;
  return x;
}

/// Deterministic gradient value: mostly O(1e-2), row 3 zero, rows 5 and 6
/// tiny enough for the eps floor to bind, step 2 large enough to clip.
float grad_value(index_t i, index_t cols, int step, std::uint64_t salt) {
  const index_t row = i / cols;
  if (row == 3) return 0.0f;
  const float u = static_cast<float>(mix(static_cast<std::uint64_t>(i) * 31 + salt + 977 * step) >> 40) * 0x1p-24f - 0.5f;
  if (row == 5 || row == 6) return u * 1e-9f;
  return u * (step == 2 ? 40.0f : 0.02f);
}

struct Tensor {
  Spec spec;
  std::vector<float> p32, g32;
  std::vector<bf16> pb, gb;
  std::vector<f16> ph;

  explicit Tensor(const Spec& s) : spec(s) {
    const auto n = static_cast<std::size_t>(s.shape.numel());
    std::vector<float> init(n);
    for (std::size_t i = 0; i < n; ++i)
      init[i] = static_cast<float>(mix(i + 12345) >> 40) * 0x1p-24f - 0.5f;
    if (s.param == Dtype::f32) p32 = init;
    if (s.param == Dtype::bf16)
      for (float x : init) pb.push_back(bf16(x));
    if (s.param == Dtype::f16)
      for (float x : init) ph.push_back(f16(x));
    if (s.grad == Dtype::f32) g32.resize(n);
    else gb.resize(n);
  }
  void set_grad(int step, std::uint64_t salt) {
    const index_t cols = spec.shape.matrices().cols;
    for (std::size_t i = 0; i < static_cast<std::size_t>(spec.shape.numel()); ++i) {
      const float g = grad_value(static_cast<index_t>(i), cols, step, salt);
      if (spec.grad == Dtype::f32) g32[i] = g;
      else gb[i] = bf16(g);
    }
  }
  ParamView param() {
    if (spec.param == Dtype::f32) return TensorView<float>(p32.data(), spec.shape);
    if (spec.param == Dtype::bf16) return TensorView<bf16>(pb.data(), spec.shape);
    return TensorView<f16>(ph.data(), spec.shape);
  }
  GradView grad() {
    if (spec.grad == Dtype::f32) return TensorView<const float>(g32.data(), spec.shape);
    return TensorView<const bf16>(gb.data(), spec.shape);
  }
  /// The parameter's bytes.
  std::vector<unsigned char> bytes() const {
    const void* d = spec.param == Dtype::f32 ? static_cast<const void*>(p32.data())
                    : spec.param == Dtype::bf16 ? static_cast<const void*>(pb.data())
                                                : static_cast<const void*>(ph.data());
    const auto n = static_cast<std::size_t>(spec.shape.numel() * dtype_size(spec.param));
    std::vector<unsigned char> out(n);
    std::memcpy(out.data(), d, n);
    return out;
  }
};

struct Result {
  std::vector<std::vector<unsigned char>> params;
  std::vector<std::vector<float>> state;
};

template <class Backend>
Result run(int threads) {
  Optimizer<SkewAdamTiers, Backend> opt(Hyperparameters{.lr = 1e-2, .weight_decay = 0.05},
                                        OptimizerOptions{.seed = 42, .threads = threads});
  std::vector<Tensor> ts;
  for (const Spec& s : specs()) ts.emplace_back(s);
  std::vector<ParamId> ids;
  for (Tensor& t : ts) ids.push_back(opt.add(t.spec.name, t.spec.tier, t.param()));
  for (int step = 0; step < 3; ++step) {
    for (std::size_t k = 0; k < ts.size(); ++k) {
      ts[k].set_grad(step, k);
      opt.set_grad(ids[k], ts[k].grad());
    }
    opt.step();
  }
  Result r;
  for (std::size_t k = 0; k < ts.size(); ++k) {
    r.params.push_back(ts[k].bytes());
    const ParamStateView s = opt.state(ids[k]);
    for (auto span : {s.m, s.v, s.v_row, s.v_col}) r.state.emplace_back(span.begin(), span.end());
  }
  return r;
}

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && (a.empty() || std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0);
}

template <class Backend>
void check_thread_counts() {
  const Result one = run<Backend>(1);
  for (int threads : {2, 3}) {
    CAPTURE(Backend::arch_name());
    CAPTURE(threads);
    const Result other = run<Backend>(threads);
    const auto sp = specs();
    for (std::size_t k = 0; k < sp.size(); ++k) {
      CAPTURE(sp[k].name);
      CHECK(one.params[k] == other.params[k]);
      for (int s = 0; s < 4; ++s) CHECK(same_bits(one.state[4 * k + s], other.state[4 * k + s]));
    }
  }
}

}  // namespace

TEST_CASE("a multi-tensor step is bit-identical for 1, 2 and 3 threads (default SIMD backend)") {
  check_thread_counts<backend::DefaultBackend>();
}

TEST_CASE("a multi-tensor step is bit-identical for 1, 2 and 3 threads (scalar backend)") {
  check_thread_counts<backend::CpuBackend<ScalarArch>>();
}

TEST_CASE("the multi-tensor step really updates every tensor and clips") {
  const Result r = run<backend::DefaultBackend>(2);
  std::vector<Tensor> fresh;
  for (const Spec& s : specs()) fresh.emplace_back(s);
  for (std::size_t k = 0; k < fresh.size(); ++k) {
    CAPTURE(fresh[k].spec.name);
    CHECK(r.params[k] != fresh[k].bytes());
  }
}

}  // namespace test_cpu_thread_determinism
