#pragma once
// The model the stored-momentum tests train (tests/unit/test_stored_momentum.cpp,
// tests/emulation/test_stored_momentum_emulated.cpp): tensors whose shapes
// reach every edge of the blocks of state_layout.hpp, gradients that do not
// depend on the parameters (so the momentum is a function of the gradients
// alone), and a decoder of the stored words.

#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <skewadam/skewadam.hpp>

namespace skewadam::test::stored {

/// The gradient of the non-finite tests, `blocks` (at least 4) blocks of 256
/// of a [blocks, 256] backbone tensor: block 0 holds a NaN (element 5), block
/// 1 a +inf (element 9), block 2 a -inf (element 0) among zeros, block 3 a
/// NaN, a +inf and a -inf (elements 1 to 3) among finite values; the other
/// elements finite and nonzero.
inline std::vector<float> nonfinite_gradient(std::size_t blocks) {
  REQUIRE(blocks >= 4);
  constexpr float nan = std::numeric_limits<float>::quiet_NaN();
  constexpr float inf = std::numeric_limits<float>::infinity();
  std::vector<float> g(blocks * 256);
  for (std::size_t i = 0; i < g.size(); ++i) g[i] = std::sin(0.37f * static_cast<float>(i)) * 1e-2f;
  std::fill(g.begin() + 512, g.begin() + 768, 0.0f);
  g[5] = nan;
  g[256 + 9] = inf;
  g[512] = -inf;
  g[768 + 1] = nan;
  g[768 + 2] = inf;
  g[768 + 3] = -inf;
  return g;
}

/// The bytes of the backbone momentum one step stores for gradient g (a
/// [g.size() / 256, 256] tensor) with beta1 = 0, so that m' is g, and
/// NonFinitePolicy::unchecked, so that the step is taken.
template <class Tiers, class Backend>
std::vector<std::uint8_t> stored_momentum_bytes(const std::vector<float>& g) {
  Hyperparameters h;
  h.beta1 = 0.0;
  const OptimizerOptions options{.seed = 3, .threads = 1, .nonfinite = NonFinitePolicy::unchecked};
  Optimizer<Tiers, Backend> opt(h, options);
  std::vector<float> p(g.size(), 0.25f);
  const Shape shape{static_cast<std::int64_t>(g.size() / 256), 256};
  const ParamId id = opt.add("w", Tier::backbone, TensorView<float>(p.data(), shape));
  opt.set_grad(id, TensorView<const float>(g.data(), shape));
  opt.step();
  const std::vector<float> m = opt.export_state().params[0].state.m;
  std::vector<std::uint8_t> bytes(4 * m.size());
  std::memcpy(bytes.data(), m.data(), bytes.size());
  return bytes;
}

/// Every tier keeps the stored momentum P: the backbone's rule, the experts'
/// bank under the factored rule with it, the router's element-wise rule
/// with it.
template <class P>
using AllStored = TierRules<BackboneRule::with_momentum<P>, ExpertRule::with_momentum<P>,
                            RouterRule::with_momentum<P>>;

struct Spec {
  std::string name;
  Tier tier;
  Shape shape;
  Dtype param;
};

inline std::vector<Spec> specs() {
  return {
      {"backbone.w", Tier::backbone, Shape{513, 257}, Dtype::bf16},      // blocks span rows
      {"backbone.blocks", Tier::backbone, Shape{1100, 300}, Dtype::f32}, // 2 row blocks, cut at row 512
      {"backbone.norm", Tier::backbone, Shape{1000}, Dtype::bf16},       // rank 1: element-wise
      {"backbone.small", Tier::backbone, Shape{7, 5}, Dtype::f32},       // one short block
      {"bank", Tier::experts, Shape{4, 96, 70}, Dtype::bf16},            // matrices end inside a block
      {"router", Tier::router, Shape{300, 500}, Dtype::f32},             // 3 element-wise chunks
  };
}

inline std::uint64_t mix(std::uint64_t x) {
  x ^= x >> 33;
  x *= 0xff51afd7ed558ccdULL;
  x ^= x >> 33;
  return x;
}

/// Gradient of element i at a step: mostly O(1e-2), with a few larger
/// values so that blocks' scales differ, and row 3 zero. It does not depend
/// on the parameters, so the momentum is a function of the gradients alone.
inline float grad_value(index_t i, index_t cols, int step, std::uint64_t salt) {
  if (i / cols == 3) return 0.0f;
  const std::uint64_t h = mix(static_cast<std::uint64_t>(i) * 31 + salt + 977 * static_cast<std::uint64_t>(step));
  const float u = static_cast<float>(h >> 40) * 0x1p-24f - 0.5f;
  return u * ((h & 63) == 0 ? 0.5f : 0.02f);
}

struct Tensor {
  Spec spec;
  std::vector<float> p32, g;
  std::vector<bf16> pb;

  /// Element i's value before any step.
  static float initial(std::size_t i) { return static_cast<float>(mix(i + 12345) >> 40) * 0x1p-24f - 0.5f; }
  explicit Tensor(const Spec& s) : spec(s) {
    const auto n = static_cast<std::size_t>(s.shape.numel());
    for (std::size_t i = 0; i < n; ++i) {
      const float x = initial(i);
      if (s.param == Dtype::f32) p32.push_back(x);
      else pb.push_back(bf16(x));
    }
    g.resize(n);
  }
  /// A tensor of this spec holding the parameter bytes `bytes`.
  static Tensor of(const Spec& s, const std::vector<unsigned char>& bytes) {
    Tensor t(s);
    void* d = s.param == Dtype::f32 ? static_cast<void*>(t.p32.data()) : static_cast<void*>(t.pb.data());
    REQUIRE(bytes.size() == static_cast<std::size_t>(s.shape.numel() * dtype_size(s.param)));
    std::memcpy(d, bytes.data(), bytes.size());
    return t;
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
  float value(std::size_t i) const { return spec.param == Dtype::f32 ? p32[i] : to_float(pb[i]); }
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

/// Whether two runs' parameters after `steps` steps agree to rounding: each
/// step moves an element by at most lr (times the clip), and stores it once,
/// so two runs whose fp32 results differ by rounding alone (sums formed in
/// another order) may store neighbours of their dtype each step. An element
/// is then within `steps` units of its dtype's rounding (bf16: 2^-8, fp32:
/// 2^-20 for the sums' error) of the magnitude it can have had: its largest
/// of before and after, and a step of lr each step.
inline bool params_agree(const Tensor& a, const Tensor& b, int steps, float lr) {
  const float unit = a.spec.param == Dtype::f32 ? 0x1p-20f : 0x1p-8f;
  for (std::size_t i = 0; i < a.g.size(); ++i) {
    const float reach = std::max({std::fabs(Tensor::initial(i)), std::fabs(a.value(i)), std::fabs(b.value(i))}) +
                        static_cast<float>(steps) * lr;
    if (!(std::fabs(a.value(i) - b.value(i)) <= static_cast<float>(steps) * unit * reach)) {
      MESSAGE("element ", i, ": ", a.value(i), " and ", b.value(i));
      return false;
    }
  }
  return true;
}

inline bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && (a.empty() || std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0);
}

inline Hyperparameters hyper() { return Hyperparameters{.lr = 1e-2, .weight_decay = 0.05}; }

/// A model of specs() and an optimizer `Opt` over it.
template <class Opt>
struct Run {
  std::unique_ptr<Opt> opt;
  std::vector<Tensor> ts;
  std::vector<ParamId> ids;
  template <class... Args>
  explicit Run(Args&&... args) : opt(std::make_unique<Opt>(std::forward<Args>(args)...)) {
    for (const Spec& s : specs()) ts.emplace_back(s);
    for (Tensor& t : ts) ids.push_back(opt->add(t.spec.name, t.spec.tier, t.param()));
  }
  void steps(int from, int to) {
    for (int step = from; step < to; ++step) {
      for (std::size_t k = 0; k < ts.size(); ++k) {
        ts[k].set_grad(step, k);
        opt->set_grad(ids[k], ts[k].grad());
      }
      opt->step();
      REQUIRE(opt->last_step().applied);
    }
  }
  /// Parameters and the complete m (collective for a sharded optimizer).
  Result result() const {
    Result r;
    const OptimizerState s = opt->export_state();
    for (std::size_t k = 0; k < ts.size(); ++k) {
      r.params.push_back(ts[k].bytes());
      r.m.push_back(s.params[k].state.m);
    }
    return r;
  }
};

template <class Tiers, class Backend = backend::DefaultBackend>
using Local = Run<Optimizer<Tiers, Backend>>;
template <class Tiers, class Backend = backend::DefaultBackend>
std::unique_ptr<Local<Tiers, Backend>> local(int threads) {
  return std::make_unique<Local<Tiers, Backend>>(hyper(), OptimizerOptions{.seed = 42, .threads = threads});
}

inline void check_same(const Result& a, const Result& b, bool params = true) {
  const auto sp = specs();
  for (std::size_t k = 0; k < sp.size(); ++k) {
    CAPTURE(sp[k].name);
    if (params) CHECK(a.params[k] == b.params[k]);
    CHECK(same_bits(a.m[k], b.m[k]));
  }
}

/// The stored momentum of P, decoded: each element's value and the largest
/// error one rounding can leave there (int8: the block's scale; float8: the
/// spacing of the codes next to the value; bf16: 0, the test's own); and
/// each element's stored byte (8-bit maps).
template <class P>
struct Decoded {
  std::vector<float> value, step;
  std::vector<std::uint8_t> code;
};
template <class P>
Decoded<P> decode(const std::vector<float>& words, const Shape& shape) {
  const MatrixGeometry g = shape.matrices();
  const index_t mat = g.matrix_size();
  Decoded<P> d;
  REQUIRE(static_cast<index_t>(words.size()) == momentum_words(StateLayout{true, false, P::storage}, g));
  for (index_t b = 0; b < g.batch; ++b)
    for (index_t e = 0; e < mat; ++e) {
      const float* blk = words.data() + momentum_word_at(P::storage, mat, b, e);
      const index_t r = e % momentum_block;
      if constexpr (P::storage == MomentumStorage::bfloat16) {
        std::uint16_t h;
        std::memcpy(&h, reinterpret_cast<const unsigned char*>(blk) + 2 * r, 2);
        d.value.push_back(to_float(from_bits<bf16>(h)));
        d.step.push_back(0.0f);
      } else {
        const std::uint8_t q = reinterpret_cast<const std::uint8_t*>(blk + 1)[r];
        d.value.push_back(P::decode(q, blk[0]));
        d.code.push_back(q);
        if constexpr (P::storage == MomentumStorage::float8_blocks) {
          const std::uint32_t c = std::min<std::uint32_t>(q & 0x7fu, 125u);
          d.step.push_back((P::unit(c + 1) - P::unit(c)) * blk[0]);
        } else {
          d.step.push_back(blk[0]);
        }
      }
    }
  return d;
}

/// The two bf16 values next to x (equal when x is one).
inline std::pair<float, float> bf16_neighbours(float x) {
  const bf16 lo = StochasticRounding::store<bf16>(x, 0u);        // truncated toward zero
  const bf16 hi = StochasticRounding::store<bf16>(x, 0xffffu);   // away from zero, unless exact
  return {to_float(lo), to_float(hi)};
}

}  // namespace skewadam::test::stored
