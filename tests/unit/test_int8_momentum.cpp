// Int8BlockMomentum (policies/int8_block_momentum.hpp): the first moment in
// 8 bits with an fp32 scale per block of 256 elements of a matrix.
//   - the same bits for 1, 2 and 3 threads, and every CPU architecture
//     within rounding of the scalar code, with blocks that span rows, row blocks cut at block boundaries, banks
//     whose matrices end inside a block, element-wise chunks;
//   - the decoded momentum against the fp32 recursion on the same gradients,
//     within the bound the policy states, and unbiased;
//   - bytes as the layout counts them, and the planner's figures;
//   - a checkpoint resumes bit-exactly and records the rule; a SkewAdam
//     optimizer with fp32 momentum refuses it and changes nothing;
//   - placements and imports that cannot hold it refuse with a clear error.

#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>
#include <tuple>
#include <vector>

#include <skewadam/skewadam.hpp>
#include <skewadam/dist/sharded_optimizer.hpp>

#include "cpu_archs.hpp"

namespace test_int8_momentum {

namespace {

using namespace skewadam;

/// Every tier keeps 8-bit momentum: the backbone's rule, the experts' bank
/// under the factored rule with it, the router's element-wise rule with it.
using AllInt8Tiers = TierRules<Backbone8bitRule, ExpertRule::with_momentum<Int8BlockMomentum>,
                               RouterRule::with_momentum<Int8BlockMomentum>>;

struct Spec {
  std::string name;
  Tier tier;
  Shape shape;
  Dtype param;
};

std::vector<Spec> specs() {
  return {
      {"backbone.w", Tier::backbone, Shape{513, 257}, Dtype::bf16},      // blocks span rows
      {"backbone.blocks", Tier::backbone, Shape{1100, 300}, Dtype::f32}, // 2 row blocks, cut at row 512
      {"backbone.norm", Tier::backbone, Shape{1000}, Dtype::bf16},       // rank 1: element-wise
      {"backbone.small", Tier::backbone, Shape{7, 5}, Dtype::f32},       // one short block
      {"bank", Tier::experts, Shape{4, 96, 70}, Dtype::bf16},            // matrices end inside a block
      {"router", Tier::router, Shape{300, 500}, Dtype::f32},             // 3 element-wise chunks
  };
}

std::uint64_t mix(std::uint64_t x) {
  x ^= x >> 33;
  x *= 0xff51afd7ed558ccdULL;
  x ^= x >> 33;
  return x;
}

/// Gradient of element i at a step: mostly O(1e-2), with a few larger
/// values so that blocks' scales differ, and row 3 zero.
float grad_value(index_t i, index_t cols, int step, std::uint64_t salt) {
  if (i / cols == 3) return 0.0f;
  const std::uint64_t h = mix(static_cast<std::uint64_t>(i) * 31 + salt + 977 * static_cast<std::uint64_t>(step));
  const float u = static_cast<float>(h >> 40) * 0x1p-24f - 0.5f;
  return u * ((h & 63) == 0 ? 0.5f : 0.02f);
}

struct Tensor {
  Spec spec;
  std::vector<float> p32, g;
  std::vector<bf16> pb;

  explicit Tensor(const Spec& s) : spec(s) {
    const auto n = static_cast<std::size_t>(s.shape.numel());
    for (std::size_t i = 0; i < n; ++i) {
      const float x = static_cast<float>(mix(i + 12345) >> 40) * 0x1p-24f - 0.5f;
      if (s.param == Dtype::f32) p32.push_back(x);
      else pb.push_back(bf16(x));
    }
    g.resize(n);
  }
  void set_grad(int step, std::uint64_t salt) {
    const index_t cols = spec.shape.matrices().cols;
    for (std::size_t i = 0; i < g.size(); ++i) g[i] = grad_value(static_cast<index_t>(i), cols, step, salt);
  }
  ParamView param() {
    if (spec.param == Dtype::f32) return TensorView<float>(p32.data(), spec.shape);
    return TensorView<bf16>(pb.data(), spec.shape);
  }
  GradView grad() const { return TensorView<const float>(g.data(), spec.shape); }
  std::vector<unsigned char> bytes() const {
    const void* d = spec.param == Dtype::f32 ? static_cast<const void*>(p32.data()) : static_cast<const void*>(pb.data());
    std::vector<unsigned char> out(static_cast<std::size_t>(spec.shape.numel() * dtype_size(spec.param)));
    std::memcpy(out.data(), d, out.size());
    return out;
  }
};

struct Result {
  std::vector<std::vector<unsigned char>> params;
  std::vector<std::vector<float>> m;
};

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && (a.empty() || std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0);
}

Hyperparameters hyper() { return Hyperparameters{.lr = 1e-2, .weight_decay = 0.05}; }

template <class Tiers, class Backend = backend::DefaultBackend>
struct Run {
  Optimizer<Tiers, Backend> opt;
  std::vector<Tensor> ts;
  std::vector<ParamId> ids;
  explicit Run(int threads = 1) : opt(hyper(), OptimizerOptions{.seed = 42, .threads = threads}) {
    for (const Spec& s : specs()) ts.emplace_back(s);
    for (Tensor& t : ts) ids.push_back(opt.add(t.spec.name, t.spec.tier, t.param()));
  }
  void steps(int from, int to) {
    for (int step = from; step < to; ++step) {
      for (std::size_t k = 0; k < ts.size(); ++k) {
        ts[k].set_grad(step, k);
        opt.set_grad(ids[k], ts[k].grad());
      }
      opt.step();
    }
  }
  Result result() const {
    Result r;
    for (std::size_t k = 0; k < ts.size(); ++k) {
      r.params.push_back(ts[k].bytes());
      const ParamStateView s = opt.state(ids[k]);
      r.m.emplace_back(s.m.begin(), s.m.end());
    }
    return r;
  }
};

void check_same(const Result& a, const Result& b) {
  const auto sp = specs();
  for (std::size_t k = 0; k < sp.size(); ++k) {
    CAPTURE(sp[k].name);
    CHECK(a.params[k] == b.params[k]);
    CHECK(same_bits(a.m[k], b.m[k]));
  }
}

/// Decoded momentum of a tensor from its stored words.
std::vector<float> decode(std::span<const float> words, const Shape& shape, std::vector<float>* scales = nullptr) {
  const MatrixGeometry g = shape.matrices();
  const index_t n = g.numel();
  const auto* codes = reinterpret_cast<const std::int8_t*>(words.data());
  const float* sc = words.data() + (n + 3) / 4;
  const index_t blocks = (g.matrix_size() + momentum_block - 1) / momentum_block;
  std::vector<float> out(static_cast<std::size_t>(n));
  for (index_t i = 0; i < n; ++i) {
    const index_t b = i / g.matrix_size();
    const index_t k = (i - b * g.matrix_size()) / momentum_block;
    out[static_cast<std::size_t>(i)] = Int8BlockMomentum::value(codes[i], sc[b * blocks + k]);
  }
  if (scales) scales->assign(sc, sc + g.batch * blocks);
  return out;
}

}  // namespace

TEST_CASE("8-bit momentum: the same bits for 1, 2 and 3 threads") {
  Run<AllInt8Tiers> one(1);
  one.steps(0, 3);
  for (int threads : {2, 3}) {
    CAPTURE(threads);
    Run<AllInt8Tiers> other(threads);
    other.steps(0, 3);
    check_same(one.result(), other.result());
  }
}

TEST_CASE_TEMPLATE_DEFINE("8-bit momentum: every CPU architecture agrees with the scalar code", Arch,
                          int8_every_arch) {
  // As for fp32 state, architectures agree to rounding, not to the bit: the
  // compiler may contract m' = beta1 m + (1 - beta1) g differently in vector
  // and scalar code; an m' one ulp apart can change its block's scale by an
  // ulp, and rarely take the other code. Each
  // step moves a decoded element by at most one scale of its block, so three
  // steps keep the two within 3 (s_a + s_b); the parameters agree to a few
  // ulps of their dtype.
  Run<AllInt8Tiers, backend::CpuBackend<ScalarArch>> scalar(2);
  scalar.steps(0, 3);
  Run<AllInt8Tiers, backend::CpuBackend<Arch>> simd(2);
  simd.steps(0, 3);
  CAPTURE(backend::CpuBackend<Arch>::arch_name());
  const auto sp = specs();
  for (std::size_t k = 0; k < sp.size(); ++k) {
    CAPTURE(sp[k].name);
    const MatrixGeometry g = sp[k].shape.matrices();
    std::vector<float> sa, sb;
    const std::vector<float> a = decode(scalar.opt.state(scalar.ids[k]).m, sp[k].shape, &sa);
    const std::vector<float> b = decode(simd.opt.state(simd.ids[k]).m, sp[k].shape, &sb);
    const auto* codes_a = reinterpret_cast<const std::int8_t*>(scalar.opt.state(scalar.ids[k]).m.data());
    const auto* codes_b = reinterpret_cast<const std::int8_t*>(simd.opt.state(simd.ids[k]).m.data());
    const index_t blocks = (g.matrix_size() + momentum_block - 1) / momentum_block;
    bool close = true, codes_equal_mostly = true;
    std::size_t differing = 0;
    for (std::size_t i = 0; i < a.size(); ++i) {
      const auto e = static_cast<index_t>(i);
      const index_t mb = e / g.matrix_size();
      const auto blk = static_cast<std::size_t>(mb * blocks + (e - mb * g.matrix_size()) / momentum_block);
      close = close && std::fabs(a[i] - b[i]) <= 3.0f * (sa[blk] + sb[blk]);
      differing += codes_a[i] != codes_b[i] ? 1 : 0;
    }
    codes_equal_mostly = differing * 100 <= a.size();  // the same codes nearly everywhere
    CHECK(close);
    CHECK(codes_equal_mostly);
    const float rel = sp[k].param == Dtype::f32 ? 1e-4f : 0x1p-6f;
    const Tensor& pa = scalar.ts[k];
    const Tensor& pb = simd.ts[k];
    bool params_close = true;
    for (std::size_t i = 0; i < pa.g.size(); ++i) {
      const float x = sp[k].param == Dtype::f32 ? pa.p32[i] : to_float(pa.pb[i]);
      const float y = sp[k].param == Dtype::f32 ? pb.p32[i] : to_float(pb.pb[i]);
      params_close = params_close && std::fabs(x - y) <= rel * std::fabs(x) + 1e-6f;
    }
    CHECK(params_close);
  }
}
TEST_CASE_TEMPLATE_APPLY(int8_every_arch, skewadam::test::SimdArchs);

TEST_CASE("8-bit momentum: within the stated bound of the fp32 recursion on the same gradients, and unbiased") {
  // The gradients do not depend on the parameters, so m32 below is what fp32
  // momentum would hold. Each step's rounding moves an element by less than
  // its block's scale s_t (1 + 2^-16); the error after T steps is then at most
  // sum_t beta1^(T-t) s_t (1 + 2^-16), plus fp32 rounding of the recursion.
  Run<AllInt8Tiers> run(2);
  const float beta1 = static_cast<float>(hyper().beta1);
  const auto sp = specs();
  std::vector<std::vector<float>> m32(sp.size()), bound(sp.size());
  for (std::size_t k = 0; k < sp.size(); ++k) {
    m32[k].assign(static_cast<std::size_t>(sp[k].shape.numel()), 0.0f);
    bound[k].assign(m32[k].size(), 0.0f);
  }
  double error_sum = 0, error_count = 0, scale_sum = 0;
  for (int step = 0; step < 6; ++step) {
    run.steps(step, step + 1);
    for (std::size_t k = 0; k < sp.size(); ++k) {
      CAPTURE(sp[k].name);
      CAPTURE(step);
      const MatrixGeometry g = sp[k].shape.matrices();
      std::vector<float> scales;
      const std::vector<float> m8 = decode(run.opt.state(run.ids[k]).m, sp[k].shape, &scales);
      const index_t blocks = (g.matrix_size() + momentum_block - 1) / momentum_block;
      bool within = true;
      for (std::size_t i = 0; i < m8.size(); ++i) {
        const auto e = static_cast<index_t>(i);
        const index_t b = e / g.matrix_size();
        const float s = scales[static_cast<std::size_t>(b * blocks + (e - b * g.matrix_size()) / momentum_block)];
        m32[k][i] = beta1 * m32[k][i] + (1.0f - beta1) * run.ts[k].g[i];
        bound[k][i] = beta1 * bound[k][i] + s * (1.0f + 0x1p-16f);
        const float err = m8[i] - m32[k][i];
        within = within && std::fabs(err) <= bound[k][i] * 1.0001f + 1e-6f * std::fabs(m32[k][i]);
        error_sum += err;
        error_count += 1;
        scale_sum += s;
      }
      CHECK(within);
    }
  }
  // Unbiased: the mean error over about 2.9 million element-steps is far
  // below the mean scale (a biased rounding, such as truncation, would put it
  // near half a scale).
  const double mean_error = error_sum / error_count;
  const double mean_scale = scale_sum / error_count;
  CHECK(std::fabs(mean_error) < 0.01 * mean_scale);
}

TEST_CASE("8-bit momentum: a block of zeros stores zeros; the codes are not all equal") {
  Run<AllInt8Tiers> run(1);
  run.steps(0, 1);
  // backbone.w's row 3 has zero gradients but its blocks span other rows;
  // backbone.small (7 x 5) is one block whose row 3 is zero.
  const std::vector<float> m = decode(run.opt.state(run.ids[3]).m, specs()[3].shape);
  for (index_t j = 0; j < 5; ++j) CHECK(m[static_cast<std::size_t>(3 * 5 + j)] == 0.0f);
  const ParamStateView s = run.opt.state(run.ids[0]);
  const auto* codes = reinterpret_cast<const std::int8_t*>(s.m.data());
  int distinct = 0;
  for (int c = -127; c <= 127; ++c)
    distinct += std::any_of(codes, codes + 513 * 257, [&](std::int8_t q) { return q == c; }) ? 1 : 0;
  CHECK(distinct > 100);
}

TEST_CASE("8-bit momentum: state bytes are the layout's, and the planner's") {
  Run<SkewAdam8bitTiers> run(1);
  index_t backbone = 0;
  for (const Spec& s : specs()) {
    if (s.tier != Tier::backbone) continue;
    const MatrixGeometry g = s.shape.matrices();
    const index_t words = (g.numel() + 3) / 4 + g.batch * ((g.matrix_size() + 255) / 256);
    backbone += 4 * words + second_moment_bytes(SkewAdam8bitTiers::layout(Tier::backbone), s.shape);
  }
  CHECK(run.opt.state_bytes(Tier::backbone) == backbone);
  const StateLayout l = SkewAdam8bitTiers::layout(Tier::backbone);
  CHECK(l.storage == MomentumStorage::int8_blocks);
  CHECK(momentum_bytes(l, Shape{4096, 4096}) == 4096 * 4096 + 4 * 4096 * 4096 / 256);
  CHECK(momentum_bytes(SkewAdamTiers::layout(Tier::backbone), Shape{4096, 4096}) == 4 * 4096 * 4096);
  // a quarter of fp32 momentum's bytes, plus 1/64 for the scales
  CHECK(momentum_bytes(l, Shape{7, 5}) == 4 * (9 + 1));
  // the same run's experts and router are SkewAdam's
  Run<SkewAdamTiers> fp32(1);
  CHECK(run.opt.state_bytes(Tier::experts) == fp32.opt.state_bytes(Tier::experts));
  CHECK(run.opt.state_bytes(Tier::router) == fp32.opt.state_bytes(Tier::router));
  CHECK(run.opt.state_bytes(Tier::backbone) < fp32.opt.state_bytes(Tier::backbone) / 3);
}

TEST_CASE("8-bit momentum: a checkpoint resumes bit-exactly and names the rule") {
  Run<AllInt8Tiers> whole(2);
  whole.steps(0, 4);

  Run<AllInt8Tiers> first(2);
  first.steps(0, 2);
  const std::vector<std::byte> bytes = checkpoint_bytes(first.opt, SaveOptions{.include_params = true});
  const CheckpointInfo info = read_checkpoint_info(std::span<const std::byte>(bytes));
  CHECK(info.tiers[0].rule == rule_name<Backbone8bitRule>());
  CHECK(info.tiers[0].rule.find("Int8BlockMomentum256") != std::string::npos);
  CHECK(info.tiers[0].layout == AllInt8Tiers::layout(Tier::backbone));

  Run<AllInt8Tiers> resumed(3);  // another thread count
  load_checkpoint(resumed.opt, std::span<const std::byte>(bytes), LoadOptions{.params = ParamValues::require});
  for (std::size_t k = 0; k < resumed.ts.size(); ++k) {  // the parameters come back with the state
    CAPTURE(resumed.ts[k].spec.name);
    CHECK(resumed.ts[k].bytes() == first.ts[k].bytes());
  }
  resumed.steps(2, 4);
  check_same(whole.result(), resumed.result());

  // fp32 momentum reads m differently: refused, nothing changed
  Run<SkewAdamTiers> other(1);
  other.steps(0, 1);
  const Result before = other.result();
  try {
    load_checkpoint(other.opt, std::span<const std::byte>(bytes));
    FAIL("an 8-bit momentum checkpoint loaded into fp32 momentum");
  } catch (const CheckpointError& e) {
    CHECK(e.kind() == CheckpointError::Kind::mismatch);
    CHECK(std::string(e.what()).find("Int8BlockMomentum256") != std::string::npos);
  }
  check_same(before, other.result());
}

TEST_CASE("8-bit momentum: imports of the wrong size and sharding are refused, naming the problem") {
  Run<SkewAdam8bitTiers> run(1);
  run.steps(0, 1);
  const Result before = run.result();
  OptimizerState state = run.opt.export_state();
  REQUIRE(!state.params.empty());
  state.params[0].state.m.resize(static_cast<std::size_t>(specs()[0].shape.numel()));  // fp32's size
  try {
    run.opt.import_state(state);
    FAIL("import of an fp32-sized m accepted");
  } catch (const std::invalid_argument& e) {
    CHECK(std::string(e.what()).find("m has") != std::string::npos);
  }
  check_same(before, run.result());

  dist::SelfCommunicator self;
  dist::ShardedOptimizer<SkewAdam8bitTiers, dist::SelfCommunicator> sharded(self, hyper());
  std::vector<float> w(64 * 64, 0.0f);
  try {
    sharded.add("backbone.w", Tier::backbone, TensorView<float>(w.data(), Shape{64, 64}));
    FAIL("sharded 8-bit momentum accepted");
  } catch (const std::invalid_argument& e) {
    CHECK(std::string(e.what()).find("Int8BlockMomentum") != std::string::npos);
  }
  CHECK(sharded.size() == 0);
}

}  // namespace test_int8_momentum
