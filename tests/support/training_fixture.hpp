#pragma once
// A small Mixture-of-Experts parameter set for tests that train for a few
// steps: every tier, f32 / bf16 / f16 parameters, f32 and low-precision
// gradients, rank 1 to 3, a matrix large enough to be split into row blocks,
// an element-wise tensor large enough to be split into chunks, and a tensor
// that receives a gradient only on some steps. Values are deterministic.

#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include <skewadam/skewadam.hpp>

namespace fixture {

inline std::uint64_t mix(std::uint64_t x) {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

/// Uniform in [-1, 1), a function of its key only.
inline float uniform(std::uint64_t key) {
  return static_cast<float>(static_cast<double>(mix(key) >> 11) * 0x1p-52 - 1.0);
}

struct Tensor {
  std::string name;
  skewadam::Tier tier = skewadam::Tier::backbone;
  skewadam::Dtype dtype = skewadam::Dtype::f32;       ///< of the parameter
  skewadam::Dtype grad_dtype = skewadam::Dtype::f32;  ///< f32 or the parameter's
  skewadam::Shape shape;
  int grad_every = 1;  ///< has a gradient on steps t with t % grad_every == 0
  std::vector<float> p32, g32;
  std::vector<skewadam::bf16> pb, gb;
  std::vector<skewadam::f16> ph, gh;

  skewadam::index_t numel() const { return shape.numel(); }

  skewadam::ParamView param() {
    using namespace skewadam;
    switch (dtype) {
      case Dtype::f32: return TensorView<float>(p32.data(), shape);
      case Dtype::bf16: return TensorView<bf16>(pb.data(), shape);
      case Dtype::f16: return TensorView<f16>(ph.data(), shape);
    }
    return {};
  }
  skewadam::GradView grad() const {
    using namespace skewadam;
    switch (grad_dtype) {
      case Dtype::f32: return TensorView<const float>(g32.data(), shape);
      case Dtype::bf16: return TensorView<const bf16>(gb.data(), shape);
      case Dtype::f16: return TensorView<const f16>(gh.data(), shape);
    }
    return {};
  }

  /// The parameter's bits.
  std::vector<unsigned char> bits() {
    const skewadam::ParamView v = param();
    std::vector<unsigned char> b(static_cast<std::size_t>(v.bytes()));
    if (!b.empty()) std::memcpy(b.data(), v.data, b.size());
    return b;
  }

  void init(std::uint64_t seed) {
    const auto n = static_cast<std::size_t>(numel());
    p32.assign(dtype == skewadam::Dtype::f32 ? n : 0, 0.0f);
    pb.assign(dtype == skewadam::Dtype::bf16 ? n : 0, skewadam::bf16(0.0f));
    ph.assign(dtype == skewadam::Dtype::f16 ? n : 0, skewadam::f16(0.0f));
    g32.assign(grad_dtype == skewadam::Dtype::f32 ? n : 0, 0.0f);
    gb.assign(grad_dtype == skewadam::Dtype::bf16 ? n : 0, skewadam::bf16(0.0f));
    gh.assign(grad_dtype == skewadam::Dtype::f16 ? n : 0, skewadam::f16(0.0f));
    for (std::size_t i = 0; i < n; ++i) {
      const float x = 0.5f * uniform(seed * 1000003u + i);
      if (!p32.empty()) p32[i] = x;
      if (!pb.empty()) pb[i] = skewadam::bf16(x);
      if (!ph.empty()) ph[i] = skewadam::f16(x);
    }
  }

  /// The gradient of step t (from 1).
  void fill_grad(std::uint64_t seed, std::int64_t t) {
    const auto n = static_cast<std::size_t>(numel());
    // a per-row scale spreads the row statistics
    const skewadam::index_t cols = shape.matrices().cols;
    for (std::size_t i = 0; i < n; ++i) {
      const float row_scale = 1.0f + 3.0f * std::abs(uniform(seed ^ (static_cast<std::uint64_t>(i) / static_cast<std::uint64_t>(cols))));
      const float x = 0.01f * row_scale * uniform((seed * 7919u + static_cast<std::uint64_t>(t)) * 0x100000001b3ULL + i);
      if (!g32.empty()) g32[i] = x;
      if (!gb.empty()) gb[i] = skewadam::bf16(x);
      if (!gh.empty()) gh[i] = skewadam::f16(x);
    }
  }
};

struct Model {
  std::vector<Tensor> tensors;

  /// `weights`: the dtype of the matrices (router and norms stay f32).
  /// `large`: include the tensors large enough to be split into row blocks
  /// and chunks (1.5 MB of parameters; without them 9 KB).
  static Model make(skewadam::Dtype weights, bool large = true) {
    using skewadam::Dtype;
    using skewadam::Tier;
    const Dtype low_grad = weights;  // some gradients in the parameter's own dtype
    Model m;
    auto add = [&](std::string name, Tier tier, Dtype dt, Dtype gdt, skewadam::Shape shape, int every = 1) {
      Tensor t;
      t.name = std::move(name);
      t.tier = tier;
      t.dtype = dt;
      t.grad_dtype = gdt;
      t.shape = shape;
      t.grad_every = every;
      t.init(m.tensors.size() + 1);
      m.tensors.push_back(std::move(t));
    };
    add("embed", Tier::backbone, weights, Dtype::f32, {40, 24});
    if (large) add("blocks.0.attn.q", Tier::backbone, weights, low_grad, {600, 512});  // 2 row blocks
    else add("blocks.0.attn.q", Tier::backbone, weights, low_grad, {24, 24});
    add("blocks.0.ln.weight", Tier::backbone, Dtype::f32, Dtype::f32, {24});
    add("blocks.1.moe.experts.w1", Tier::experts, weights, low_grad, {4, 24, 16});
    add("blocks.1.moe.experts.w2", Tier::experts, weights, Dtype::f32, {4, 16, 24}, 2);  // every other step
    add("blocks.1.moe.experts.bias", Tier::experts, weights, Dtype::f32, {16});
    if (large) add("blocks.1.moe.router", Tier::router, Dtype::f32, Dtype::f32, {160, 512});  // 2 chunks
    else add("blocks.1.moe.router", Tier::router, Dtype::f32, Dtype::f32, {4, 24});
    return m;
  }

  /// Registers every tensor (in reverse order when asked); returns ids by tensor index.
  template <class Opt>
  std::vector<skewadam::ParamId> register_with(Opt& opt, bool reversed = false) {
    std::vector<skewadam::ParamId> ids(tensors.size());
    for (std::size_t k = 0; k < tensors.size(); ++k) {
      const std::size_t i = reversed ? tensors.size() - 1 - k : k;
      ids[i] = opt.add(tensors[i].name, tensors[i].tier, tensors[i].param());
    }
    return ids;
  }

  /// Runs steps first+1 .. last.
  template <class Opt>
  void train(Opt& opt, const std::vector<skewadam::ParamId>& ids, std::int64_t first, std::int64_t last) {
    for (std::int64_t t = first + 1; t <= last; ++t) {
      for (std::size_t i = 0; i < tensors.size(); ++i) {
        Tensor& x = tensors[i];
        if (t % x.grad_every == 0) {
          x.fill_grad(i + 1, t);
          opt.set_grad(ids[i], x.grad());
        } else {
          opt.clear_grad(ids[i]);
        }
      }
      opt.step();
    }
  }
};

/// The per-tier hyperparameters the tests train with.
inline skewadam::PerTier<skewadam::Hyperparameters> tier_hyper() {
  using namespace skewadam;
  PerTier<Hyperparameters> h;
  h.backbone = Hyperparameters{.lr = 1e-2, .weight_decay = 0.05};
  h.experts = Hyperparameters{.lr = 2e-2, .weight_decay = 0.05, .clip_scope = ClipScope::matrix};
  h.router = Hyperparameters{.lr = 5e-3, .beta2 = 0.9999};
  return h;
}

/// An optimizer with those, and an lr schedule on the backbone.
template <class Opt>
Opt make_optimizer(int threads, std::uint64_t seed = 1234,
                   skewadam::NonFinitePolicy policy = skewadam::NonFinitePolicy::skip_step) {
  using namespace skewadam;
  Opt opt(tier_hyper(), OptimizerOptions{.seed = seed, .threads = threads, .nonfinite = policy});
  opt.set_lr_schedule(Tier::backbone, WarmupCosine{.peak_lr = 1e-2, .warmup_steps = 2, .total_steps = 10});
  return opt;
}

/// Everything observable about a training run: parameter bits and state, by name.
struct Snapshot {
  std::vector<std::string> names;
  std::vector<std::vector<unsigned char>> params;
  std::vector<std::vector<float>> m, v, v_row, v_col;
  std::vector<std::int64_t> step;
  std::vector<std::uint32_t> stream;
  std::int64_t steps = 0;
  std::uint64_t seed = 0;

  template <class Opt>
  static Snapshot take(Model& model, const Opt& opt) {
    Snapshot s;
    for (Tensor& t : model.tensors) {
      const skewadam::ParamId id = *opt.find(t.name);
      const skewadam::ParamStateView st = opt.state(id);
      s.names.push_back(t.name);
      s.params.push_back(t.bits());
      s.m.emplace_back(st.m.begin(), st.m.end());
      s.v.emplace_back(st.v.begin(), st.v.end());
      s.v_row.emplace_back(st.v_row.begin(), st.v_row.end());
      s.v_col.emplace_back(st.v_col.begin(), st.v_col.end());
      s.step.push_back(st.step);
      s.stream.push_back(opt.rounding_stream(id));
    }
    s.steps = opt.steps();
    s.seed = opt.seed();
    return s;
  }

  /// Bitwise equality (NaN payloads included).
  friend bool operator==(const Snapshot& a, const Snapshot& b) {
    auto same = [](const std::vector<float>& x, const std::vector<float>& y) {
      return x.size() == y.size() && (x.empty() || std::memcmp(x.data(), y.data(), 4 * x.size()) == 0);
    };
    if (a.names != b.names || a.params != b.params || a.step != b.step || a.stream != b.stream ||
        a.steps != b.steps || a.seed != b.seed)
      return false;
    for (std::size_t i = 0; i < a.names.size(); ++i)
      if (!same(a.m[i], b.m[i]) || !same(a.v[i], b.v[i]) || !same(a.v_row[i], b.v_row[i]) ||
          !same(a.v_col[i], b.v_col[i]))
        return false;
    return true;
  }
};

}  // namespace fixture
