#pragma once
// Golden conformance cases (format skewadam-golden/1, docs/conformance.md):
// loading, running through the rule the case names, comparing, and writing
// outputs in the same layout. Shared by skewadam-replay and the test suite.
//
// Cases of the original format (fp32 parameters, the rule named by the tier
// flags) and cases with the optional keys of docs/conformance.md (param_dtype,
// grad_dtype, rule, param_name, rounding, an ulps tolerance for 16-bit
// parameters) load alike; absent keys take the original meaning.

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <filesystem>
#include <cstdio>
#include <fstream>
#include <limits>
#include <map>
#include <memory>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include <skewadam/checkpoint/format.hpp>
#include <skewadam/skewadam.hpp>
#if defined(SKEWADAM_TOOL_KERNELS)
#include "tool_kernels.hpp"
#endif

#include "npy.hpp"

namespace skewadam::tools {

class CaseError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

/// How close an array must be: |got - expected| <= atol + rtol |expected|
/// element-wise; or, for the parameter of a 16-bit case (ulps >= 0), every
/// value within `ulps` spacings of the dtype (at the element's largest
/// magnitude) and at most max_mismatch_fraction of all values not identical
/// (docs/conformance.md).
struct Tolerance {
  double rtol = 0;
  double atol = 0;
  double ulps = -1;  ///< < 0: rtol/atol
  double max_mismatch_fraction = 0;
  bool by_ulps() const { return ulps >= 0; }
};

/// The rule a case runs: the one its tier flags name, or AdamW's.
enum class CaseRule { tiered, adamw };
enum class CaseRounding { stochastic, nearest };

/// A tensor's values as an optimizer holds them: fp32, bf16 or fp16 in
/// memory, built from fp32 values that are exactly values of that dtype (a
/// case's files hold 16-bit values widened to fp32).
class TypedValues {
 public:
  TypedValues() = default;
  /// Throws CaseError naming `what` when a value is not one of dtype's.
  TypedValues(Dtype dtype, const std::vector<float>& values, const std::string& what);

  Dtype dtype() const noexcept { return dtype_; }
  std::int64_t size() const noexcept { return size_; }
  /// Element `offset` onwards, in memory (dtype_size(dtype()) bytes each).
  void* data(std::int64_t offset = 0) noexcept;
  const void* data(std::int64_t offset = 0) const noexcept;
  ParamView param_view(std::int64_t offset, const Shape& shape) noexcept;
  GradView grad_view(std::int64_t offset, const Shape& shape) const noexcept;
  /// count values from `offset`, widened to fp32 (exact), into out.
  void widen(std::int64_t offset, std::int64_t count, float* out) const noexcept;

 private:
  Dtype dtype_ = Dtype::f32;
  std::int64_t size_ = 0;
  std::vector<float> f32_;
  std::vector<bf16> bf16_;
  std::vector<f16> f16_;
};

inline TypedValues::TypedValues(Dtype dtype, const std::vector<float>& values, const std::string& what)
    : dtype_(dtype), size_(static_cast<std::int64_t>(values.size())) {
  auto narrow = [&]<class T>(std::vector<T>& out) {
    out.reserve(values.size());
    for (std::size_t i = 0; i < values.size(); ++i) {
      const T x = round_nearest<T>(values[i]);
      if (float_bits(to_float(x)) != float_bits(values[i]) && !(std::isnan(values[i]) && std::isnan(to_float(x)))) {
        char value[32];
        std::snprintf(value, sizeof value, "%.9g", static_cast<double>(values[i]));
        throw CaseError(what + ": value " + value + " at index " + std::to_string(i) + " is not a " +
                        std::string(dtype_name(dtype)) + " value");
      }
      out.push_back(x);
    }
  };
  switch (dtype) {
    case Dtype::f32: f32_ = values; break;
    case Dtype::bf16: narrow(bf16_); break;
    case Dtype::f16: narrow(f16_); break;
  }
}

inline void* TypedValues::data(std::int64_t offset) noexcept {
  return const_cast<void*>(std::as_const(*this).data(offset));
}

inline const void* TypedValues::data(std::int64_t offset) const noexcept {
  const auto k = static_cast<std::size_t>(offset);
  switch (dtype_) {
    case Dtype::bf16: return bf16_.data() + k;
    case Dtype::f16: return f16_.data() + k;
    default: return f32_.data() + k;
  }
}

inline ParamView TypedValues::param_view(std::int64_t offset, const Shape& shape) noexcept {
  switch (dtype_) {
    case Dtype::bf16: return TensorView<bf16>(static_cast<bf16*>(data(offset)), shape);
    case Dtype::f16: return TensorView<f16>(static_cast<f16*>(data(offset)), shape);
    default: return TensorView<float>(static_cast<float*>(data(offset)), shape);
  }
}

inline GradView TypedValues::grad_view(std::int64_t offset, const Shape& shape) const noexcept {
  switch (dtype_) {
    case Dtype::bf16: return TensorView<const bf16>(static_cast<const bf16*>(data(offset)), shape);
    case Dtype::f16: return TensorView<const f16>(static_cast<const f16*>(data(offset)), shape);
    default: return TensorView<const float>(static_cast<const float*>(data(offset)), shape);
  }
}

inline void TypedValues::widen(std::int64_t offset, std::int64_t count, float* out) const noexcept {
  const auto k = static_cast<std::size_t>(offset);
  for (std::size_t i = 0; i < static_cast<std::size_t>(count); ++i) {
    switch (dtype_) {
      case Dtype::bf16: out[i] = to_float(bf16_[k + i]); break;
      case Dtype::f16: out[i] = to_float(f16_[k + i]); break;
      default: out[i] = f32_[k + i]; break;
    }
  }
}

struct GoldenCase {
  std::filesystem::path dir;
  std::string name;
  std::string description;
  std::vector<std::int64_t> shape;
  std::int64_t steps = 0;
  bool momentum = false;
  bool factored = false;
  CaseRule rule = CaseRule::tiered;
  /// How the rule stores its momentum (docs/spec.md §5, E7).
  MomentumStorage momentum_storage = MomentumStorage::f32;
  Dtype param_dtype = Dtype::f32;
  Dtype grad_dtype = Dtype::f32;
  std::string param_name;  ///< the name the parameter is registered under: keys its rounding stream
  CaseRounding rounding = CaseRounding::stochastic;
  std::uint64_t seed = OptimizerOptions{}.seed;  ///< the stochastic-rounding seed
  /// Global gradient-norm clipping (grad_clip; docs/spec.md E6, E8): 0 off.
  double max_grad_norm = 0;
  ClipNorm clip_norm = ClipNorm::current;
  Hyperparameters hyper;
  std::vector<double> lr_schedule;
  Tolerance tolerance;
  std::map<std::string, Tolerance> state_tolerance;
  NpyArray param0, grads, params;
  std::map<std::string, NpyArray> state;  ///< exp_avg, v, v_row, v_col as present

  std::int64_t numel() const {
    std::int64_t n = 1;
    for (auto d : shape) n *= d;
    return n;
  }
  Shape tensor_shape() const { return Shape(shape.begin(), static_cast<index_t>(shape.size()), "case shape"); }
  /// The optimizer options the case needs (its rounding seed and gradient
  /// clipping), with `threads`.
  OptimizerOptions options(int threads = 1) const {
    return OptimizerOptions{.seed = seed, .threads = threads, .max_grad_norm = max_grad_norm, .clip_norm = clip_norm};
  }
  /// Whether its steps can be captured as a CUDA graph and replayed (not
  /// when clipping by the previous step's norm, E8).
  bool capturable() const { return !(max_grad_norm > 0 && clip_norm == ClipNorm::previous); }
  /// The parameter before step 1, and every step's gradient, in their dtypes.
  TypedValues initial_param() const { return TypedValues(param_dtype, param0.data, (dir / "param0.npy").string()); }
  TypedValues typed_grads() const { return TypedValues(grad_dtype, grads.data, (dir / "grads.npy").string()); }
};

namespace detail {

inline Tolerance parse_tolerance(const nlohmann::json& j, const std::string& where, bool ulps_allowed = false) {
  if (ulps_allowed && j.is_object() && j.contains("ulps")) {
    if (!j["ulps"].is_number() || !j.contains("max_mismatch_fraction") || !j["max_mismatch_fraction"].is_number())
      throw CaseError(where + ": expected {\"ulps\": number, \"max_mismatch_fraction\": number}");
    Tolerance t;
    t.ulps = j["ulps"].get<double>();
    t.max_mismatch_fraction = j["max_mismatch_fraction"].get<double>();
    if (!(t.ulps >= 0) || !(t.max_mismatch_fraction >= 0) || !(t.max_mismatch_fraction <= 1))
      throw CaseError(where + ": ulps must be >= 0 and max_mismatch_fraction in [0, 1]");
    return t;
  }
  if (j.is_object() && j.contains("ulps"))
    throw CaseError(where + ": an ulps tolerance needs a 16-bit parameter (param_dtype bf16 or f16)");
  if (!j.is_object() || !j.contains("rtol") || !j.contains("atol") || !j["rtol"].is_number() ||
      !j["atol"].is_number())
    throw CaseError(where + ": expected {\"rtol\": number, \"atol\": number}");
  Tolerance t{j["rtol"].get<double>(), j["atol"].get<double>()};
  if (!(t.rtol >= 0) || !(t.atol >= 0)) throw CaseError(where + ": tolerances must be >= 0");
  return t;
}

inline std::vector<std::int64_t> state_shape(const std::string& name, const std::vector<std::int64_t>& shape) {
  std::vector<std::int64_t> s = shape;
  if (name == "v_row") s.pop_back();                     // [..., r]
  else if (name == "v_col") s.erase(s.end() - 2);        // [..., c]
  return s;
}

}  // namespace detail

/// Loads and validates a case folder; throws CaseError naming the file.
inline GoldenCase load_golden_case(const std::filesystem::path& dir) {
  namespace fs = std::filesystem;
  GoldenCase c;
  c.dir = dir;
  c.name = dir.filename().string();
  if (c.name.empty()) c.name = dir.parent_path().filename().string();
  if (!fs::is_directory(dir)) throw CaseError(dir.string() + ": not a case folder (no such directory)");
  const fs::path json_path = dir / "case.json";
  std::ifstream in(json_path);
  if (!in) throw CaseError(json_path.string() + ": cannot open");
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(in);
  } catch (const std::exception& e) {
    throw CaseError(json_path.string() + ": malformed JSON: " + e.what());
  }
  const std::string where = json_path.string();
  try {
    if (j.contains("format") && j["format"] != "skewadam-golden/1")
      throw CaseError(where + ": unknown format " + j["format"].dump());
    c.description = j.value("description", "");
    c.shape = j.at("shape").get<std::vector<std::int64_t>>();
    if (c.shape.empty() || c.shape.size() > static_cast<std::size_t>(max_rank))
      throw CaseError(where + ": shape must have rank 1.." + std::to_string(max_rank));
    for (auto d : c.shape)
      if (d <= 0) throw CaseError(where + ": shape has a dimension <= 0");
    c.steps = j.at("steps").get<std::int64_t>();
    if (c.steps < 1) throw CaseError(where + ": steps must be >= 1");
    c.momentum = j.at("tier").at("momentum").get<bool>();
    c.factored = j.at("tier").at("factored").get<bool>();
    // Optional keys (docs/conformance.md); absent, they mean what the
    // original format did.
    const std::string rule = j.value("rule", "skewadam");
    if (rule == "adamw") {
      if (!c.momentum || c.factored)
        throw CaseError(where + ": rule adamw keeps momentum and an exact second moment "
                                "(tier.momentum true, tier.factored false)");
      c.rule = CaseRule::adamw;
    } else if (rule != "skewadam") {
      throw CaseError(where + ": unknown rule \"" + rule + "\" (expected skewadam or adamw)");
    }
    const std::string storage = j.value("momentum_storage", "f32");
    if (storage == "bf16") c.momentum_storage = MomentumStorage::bfloat16;
    else if (storage == "int8_blocks") c.momentum_storage = MomentumStorage::int8_blocks;
    else if (storage == "float8_blocks") c.momentum_storage = MomentumStorage::float8_blocks;
    else if (storage != "f32")
      throw CaseError(where + ": unknown momentum_storage \"" + storage +
                      "\" (expected f32, bf16, float8_blocks or int8_blocks)");
    if (c.momentum_storage != MomentumStorage::f32 && (!c.momentum || c.rule != CaseRule::tiered))
      throw CaseError(where + ": momentum_storage " + storage +
                      " needs the skewadam rule with momentum (tier.momentum true)");
    c.param_dtype = parse_dtype(j.value("param_dtype", "f32"), "param_dtype");
    c.grad_dtype = parse_dtype(j.value("grad_dtype", "f32"), "grad_dtype");
    if (c.grad_dtype != Dtype::f32 && c.grad_dtype != c.param_dtype)
      throw CaseError(where + ": grad_dtype must be f32 or the param_dtype");
    c.param_name = j.value("param_name", c.name.empty() ? std::string("param") : c.name);
    if (c.param_name.empty()) throw CaseError(where + ": param_name must not be empty");
    if (j.contains("rounding")) {
      const auto& r = j["rounding"];
      if (!r.is_object()) throw CaseError(where + ": rounding must be an object");
      const std::string mode = r.value("mode", "stochastic");
      if (mode == "nearest") c.rounding = CaseRounding::nearest;
      else if (mode != "stochastic")
        throw CaseError(where + ": rounding.mode \"" + mode + "\" (expected stochastic or nearest)");
      if (r.contains("seed")) {
        if (!r["seed"].is_number_unsigned()) throw CaseError(where + ": rounding.seed must be an integer in [0, 2^64)");
        c.seed = r["seed"].get<std::uint64_t>();
      }
      if (r.contains("stream") &&
          (!r["stream"].is_number_unsigned() || r["stream"].get<std::uint64_t>() != tensor_id(c.param_name)))
        throw CaseError(where + ": rounding.stream " + r["stream"].dump() + " is not the stream of param_name \"" +
                        c.param_name + "\" (" + std::to_string(tensor_id(c.param_name)) + ", FNV-1a of the name)");
    }
    if (c.momentum_storage != MomentumStorage::f32 && c.rounding == CaseRounding::nearest)
      throw CaseError(where + ": momentum_storage other than f32 is run with stochastic rounding of the parameter");
    const auto& h = j.at("hyper");
    c.hyper.beta1 = h.at("beta1").get<double>();
    c.hyper.beta2 = h.at("beta2").get<double>();
    c.hyper.eps = h.at("eps").get<double>();
    c.hyper.weight_decay = h.at("weight_decay").get<double>();
    c.hyper.clip_threshold = h.at("clip_threshold").get<double>();
    c.lr_schedule = h.at("lr_schedule").get<std::vector<double>>();
    if (static_cast<std::int64_t>(c.lr_schedule.size()) != c.steps)
      throw CaseError(where + ": lr_schedule has " + std::to_string(c.lr_schedule.size()) + " values for " +
                      std::to_string(c.steps) + " steps");
    c.hyper.lr = c.lr_schedule.front();
    c.hyper.clip_scope = parse_clip_scope(j.value("clip_scope", "tensor"), where + ": clip_scope");
    validate(c.hyper, where + ": hyper");
    for (double lr : c.lr_schedule)
      if (!(lr >= 0) || !std::isfinite(lr)) throw CaseError(where + ": lr_schedule has an invalid value");
    if (j.contains("grad_clip")) {
      const auto& g = j["grad_clip"];
      if (!g.is_object() || !g.contains("max_norm") || !g["max_norm"].is_number())
        throw CaseError(where + ": grad_clip must be {\"max_norm\": number, \"norm\": \"current\" or \"previous\"}");
      c.max_grad_norm = g["max_norm"].get<double>();
      if (!(c.max_grad_norm > 0) || !std::isfinite(c.max_grad_norm))
        throw CaseError(where + ": grad_clip.max_norm must be finite and > 0");
      c.clip_norm = parse_clip_norm(g.value("norm", "current"), where + ": grad_clip.norm");
    }
    c.tolerance = detail::parse_tolerance(j.at("tolerance"), where + ": tolerance", c.param_dtype != Dtype::f32);
    if (j.contains("state_tolerance"))
      for (auto& [k, v] : j["state_tolerance"].items())
        c.state_tolerance[k] = detail::parse_tolerance(v, where + ": state_tolerance." + k);
  } catch (const CaseError&) {
    throw;
  } catch (const std::exception& e) {
    throw CaseError(where + ": " + e.what());
  }

  auto expect = [&](const NpyArray& a, const std::vector<std::int64_t>& shape, const std::string& file) {
    if (a.shape != shape) {
      std::string s = "[";
      for (auto d : shape) s += std::to_string(d) + ",";
      throw CaseError((dir / file).string() + ": shape does not match case.json (expected " + s + "])");
    }
  };
  try {
    c.param0 = read_npy(dir / "param0.npy");
    expect(c.param0, c.shape, "param0.npy");
    std::vector<std::int64_t> seq = c.shape;
    seq.insert(seq.begin(), c.steps);
    c.grads = read_npy(dir / "grads.npy");
    expect(c.grads, seq, "grads.npy");
    c.params = read_npy(dir / "params.npy");
    expect(c.params, seq, "params.npy");
    // 16-bit values, widened to fp32 in the files: each must be exactly one
    (void)c.initial_param();
    (void)c.typed_grads();
    (void)TypedValues(c.param_dtype, c.params.data, (dir / "params.npy").string());
    const bool fact = c.factored && c.shape.size() >= 2;
    std::vector<std::string> names;
    if (c.momentum) names.push_back("exp_avg");
    if (fact) {
      names.push_back("v_row");
      names.push_back("v_col");
    } else {
      names.push_back("v");
    }
    for (const auto& n : names) {
      const fs::path f = dir / (n + ".npy");
      if (!fs::exists(f)) throw CaseError(f.string() + ": missing (the case's tier keeps " + n + ")");
      c.state[n] = read_npy(f);
      expect(c.state[n], detail::state_shape(n, c.shape), n + ".npy");
      if (!c.state_tolerance.count(n)) throw CaseError(where + ": state_tolerance has no entry for " + n);
    }
  } catch (const NpyError& e) {
    throw CaseError(e.what());
  }
  return c;
}

/// What a run computed: the parameter after every step (16-bit values
/// widened to fp32) and the final state.
struct CaseRun {
  std::vector<float> params;                           ///< steps * numel
  std::map<std::string, std::vector<float>> state;    ///< exp_avg, v, v_row, v_col
};

/// The checkpoint metadata key holding the case step a replay saved after:
/// with clipping by the previous step's norm (E8) the case's first step only
/// measures, so the optimizer's step count trails the case's steps by one.
inline constexpr const char* case_step_key = "skewadam-replay.case_step";

/// The case step a checkpoint was saved after: its case_step_key, else
/// (a checkpoint saved without it) its step count. CaseError when the value
/// is not a step count.
inline std::int64_t saved_case_step(const CheckpointInfo& info) {
  const std::string* v = info.find_metadata(case_step_key);
  if (!v) return info.steps;
  std::size_t used = 0;
  long long k = -1;
  try {
    k = std::stoll(*v, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  if (used != v->size() || k < info.steps)
    throw CaseError(std::string(case_step_key) + " '" + *v + "': not a case step (the checkpoint holds " +
                    std::to_string(info.steps) + " optimizer steps)");
  return k;
}

/// Runs steps [first, last) of a case on `opt` (the case's parameter already
/// registered as `id`, its values in `param`), recording into run.params.
template <class Opt>
void run_golden_steps(const GoldenCase& c, Opt& opt, ParamId id, const TypedValues& param, const TypedValues& grads,
                      std::int64_t first, std::int64_t last, CaseRun& run) {
  const std::int64_t n = c.numel();
  const Shape shape = c.tensor_shape();
  run.params.resize(static_cast<std::size_t>(c.steps * n));
  for (std::int64_t t = first; t < last; ++t) {
    opt.set_grad(id, grads.grad_view(t * n, shape));
    opt.set_lr(c.lr_schedule[static_cast<std::size_t>(t)]);
    opt.step();
    param.widen(0, n, run.params.data() + t * n);
  }
}

/// The case's arrays of a final state s, by their names in the case (the
/// momentum decoded from its storage).
inline void collect_state(const GoldenCase& c, const ParamState& s, CaseRun& run) {
  run.state.clear();
  if (!s.m.empty()) run.state["exp_avg"] = decode_momentum(c.momentum_storage, c.tensor_shape().matrices(), s.m);
  if (!s.v.empty()) run.state["v"] = s.v;
  if (!s.v_row.empty()) run.state["v_row"] = s.v_row;
  if (!s.v_col.empty()) run.state["v_col"] = s.v_col;
}
/// The final state of the case's parameter, from export_state() (so that it
/// works on every placement; sharded, it is collective).
template <class Opt>
void collect_state(const GoldenCase& c, const Opt& opt, ParamId id, CaseRun& run) {
  collect_state(c, opt.export_state().params[static_cast<std::size_t>(id.index)].state, run);
}

/// Calls f.template operator()<Rule>() with the rule the case names: AdamW's
/// (rule "adamw"), else the one its tier flags name; with round-to-nearest as
/// its rounding policy when the case says so.
template <class F>
decltype(auto) with_case_rule(const GoldenCase& c, F&& f) {
  auto rounded = [&]<class Rule>() -> decltype(auto) {
    if (c.rounding == CaseRounding::nearest)
      return f.template operator()<typename Rule::template with_rounding<NearestRounding>>();
    return f.template operator()<Rule>();
  };
  if (c.rule == CaseRule::adamw) return rounded.template operator()<AdamWRule>();
  // momentum stored in fewer bits: stochastic rounding of the parameter, as
  // the cases of docs/conformance.md give it (load_golden_case refuses another)
  if (c.momentum_storage != MomentumStorage::f32 && c.rounding == CaseRounding::nearest)
    throw CaseError(c.name + ": momentum_storage other than f32 is run with stochastic rounding of the parameter");
  if (c.momentum && c.momentum_storage == MomentumStorage::bfloat16)
    return c.factored ? f.template operator()<BackboneRule::with_momentum<Bf16Momentum>>()
                      : f.template operator()<ExactMomentumRule::with_momentum<Bf16Momentum>>();
  if (c.momentum && c.momentum_storage == MomentumStorage::int8_blocks)
    return c.factored ? f.template operator()<BackboneRule::with_momentum<Int8BlockMomentum>>()
                      : f.template operator()<ExactMomentumRule::with_momentum<Int8BlockMomentum>>();
  if (c.momentum && c.momentum_storage == MomentumStorage::float8_blocks)
    return c.factored ? f.template operator()<BackboneRule::with_momentum<Float8BlockMomentum>>()
                      : f.template operator()<ExactMomentumRule::with_momentum<Float8BlockMomentum>>();
  if (c.momentum && c.factored) return rounded.template operator()<BackboneRule>();
  if (c.momentum) return rounded.template operator()<ExactMomentumRule>();
  if (c.factored) return rounded.template operator()<ExpertRule>();
  return rounded.template operator()<RouterRule>();
}

/// Runs a whole case from a fresh state, as docs/conformance.md says, on the
/// optimizer `make.template operator()<Tiers>(hyper, options)` returns (a
/// pointer-like owner of any front-end configuration; `options` carries the
/// case's rounding seed, the maker sets what else it needs, e.g. threads).
template <class Make>
CaseRun run_golden_case_on(const GoldenCase& c, Make&& make) {
  return with_case_rule(c, [&]<class Rule>() {
    auto opt = make.template operator()<TierRules<Rule, Rule, Rule>>(c.hyper, c.options());
    TypedValues param = c.initial_param();
    const TypedValues grads = c.typed_grads();
    const ParamId id = opt->add(c.param_name, Tier::backbone, param.param_view(0, c.tensor_shape()));
    CaseRun run;
    run_golden_steps(c, *opt, id, param, grads, 0, c.steps, run);
    collect_state(c, *opt, id, run);
    return run;
  });
}

/// The same on the local placement of a CPU backend.
template <class Backend = backend::DefaultBackend>
CaseRun run_golden_case(const GoldenCase& c, int threads = 1) {
  return run_golden_case_on(c, [&]<class Tiers>(const Hyperparameters& h, OptimizerOptions o) {
    o.threads = threads;
    return std::make_unique<Optimizer<Tiers, Backend>>(h, o);
  });
}

/// Worst error of one array as a fraction of its tolerance (<= 1 passes).
struct ArrayCheck {
  std::string array;
  double worst = 0;          ///< max |got - expected| / (atol + rtol |expected|); ulps: see compare_ulps
  std::int64_t worst_index = -1;
  bool ok = false;
  std::string problem;       ///< set when sizes differ or values are not finite
  std::string detail;        ///< ulps tolerances: how many values differ, and by how much
};

/// Whether the arrays' sizes differ; if so, r says so and fails.
inline bool sizes_differ(ArrayCheck& r, std::size_t got, std::size_t expected) {
  if (got == expected) return false;
  r.problem = "has " + std::to_string(got) + " values, expected " + std::to_string(expected);
  r.worst = INFINITY;
  return true;
}

inline ArrayCheck compare_array(const std::string& name, const std::vector<float>& got, const std::vector<float>& expected,
                                Tolerance tol) {
  ArrayCheck r;
  r.array = name;
  if (sizes_differ(r, got.size(), expected.size())) return r;
  for (std::size_t i = 0; i < got.size(); ++i) {
    const double e = expected[i];
    const double g = got[i];
    const double allowed = tol.atol + tol.rtol * std::fabs(e);
    const double err = std::fabs(g - e);
    double frac = err / allowed;
    if (std::isnan(g) != std::isnan(e) || (std::isnan(err) && !std::isnan(e))) frac = INFINITY;
    if (std::isnan(frac)) frac = err == 0 ? 0 : INFINITY;
    if (frac > r.worst || r.worst_index < 0) {
      r.worst = frac;
      r.worst_index = static_cast<std::int64_t>(i);
    }
  }
  r.ok = r.worst <= 1.0;
  return r;
}

namespace detail {

/// The distance between neighbouring values of a 16-bit dtype at magnitude
/// m (at 0 and among subnormals: the subnormal spacing).
inline double spacing(Dtype dtype, double m) {
  const int mantissa = dtype == Dtype::bf16 ? 7 : 10;
  const int min_exponent = dtype == Dtype::bf16 ? -126 : -14;
  int e = min_exponent;
  if (m > 0) {
    (void)std::frexp(m, &e);  // m = f 2^e, f in [0.5, 1): the binade's exponent is e - 1
    e = std::max(e - 1, min_exponent);
  }
  return std::ldexp(1.0, e - mantissa);
}

}  // namespace detail

/// The 16-bit parameter check (docs/conformance.md). got and expected hold
/// whole steps of the case's parameter (all of them, or a run of them); the
/// expected values of every step are in c.params. Each value must be within tol.ulps spacings of the
/// dtype of the expected one, the spacing taken at the element's largest
/// expected magnitude over the whole run; and at most
/// tol.max_mismatch_fraction of the values may differ at all. worst is the
/// larger of (largest difference in spacings / ulps) and (mismatch fraction
/// / its bound).
inline ArrayCheck compare_ulps(const GoldenCase& c, const std::string& name, const std::vector<float>& got,
                               const std::vector<float>& expected) {
  const Tolerance tol = c.tolerance;
  ArrayCheck r;
  r.array = name;
  if (sizes_differ(r, got.size(), expected.size())) return r;
  const auto n = static_cast<std::size_t>(c.numel());
  std::vector<double> largest(n, 0.0);
  for (std::size_t i = 0; i < c.params.data.size(); ++i)
    largest[i % n] = std::max(largest[i % n], std::fabs(static_cast<double>(c.params.data[i])));
  std::int64_t differ = 0;
  double far = 0;
  for (std::size_t i = 0; i < got.size(); ++i) {
    if (float_bits(got[i]) == float_bits(expected[i])) continue;
    ++differ;
    const std::size_t element = i % n;  // got starts at a step boundary
    double d = std::fabs(static_cast<double>(got[i]) - expected[i]) / detail::spacing(c.param_dtype, largest[element]);
    if (std::isnan(d)) d = INFINITY;
    if (d > far || r.worst_index < 0) {
      far = d;
      r.worst_index = static_cast<std::int64_t>(i);
    }
  }
  const double fraction = got.empty() ? 0.0 : static_cast<double>(differ) / static_cast<double>(got.size());
  auto ratio = [](double x, double bound) { return x == 0 ? 0.0 : bound > 0 ? x / bound : INFINITY; };
  r.worst = std::max(ratio(far, tol.ulps), ratio(fraction, tol.max_mismatch_fraction));
  r.ok = far <= tol.ulps && fraction <= tol.max_mismatch_fraction;
  char buf[240];
  std::snprintf(buf, sizeof buf, "%lld of %zu values differ (%.3f %%, at most %g %%), by at most %g %s spacings (at most %g)",
                static_cast<long long>(differ), got.size(), 100 * fraction, 100 * tol.max_mismatch_fraction, far,
                std::string(dtype_name(c.param_dtype)).c_str(), tol.ulps);
  r.detail = buf;
  return r;
}

/// Checks the parameter values of whole steps (params.npy or a run of its
/// steps) by the case's parameter tolerance.
inline ArrayCheck compare_params(const GoldenCase& c, const std::vector<float>& got, const std::vector<float>& expected) {
  if (c.tolerance.by_ulps()) return compare_ulps(c, "params", got, expected);
  return compare_array("params", got, expected, c.tolerance);
}

inline std::vector<ArrayCheck> check_golden_case(const GoldenCase& c, const CaseRun& run) {
  std::vector<ArrayCheck> out;
  out.push_back(compare_params(c, run.params, c.params.data));
  for (const auto& [name, expected] : c.state) {
    auto it = run.state.find(name);
    if (it == run.state.end()) {
      ArrayCheck r;
      r.array = name;
      r.worst = INFINITY;
      r.problem = "not kept by the rule";
      out.push_back(r);
      continue;
    }
    out.push_back(compare_array(name, it->second, expected.data, c.state_tolerance.at(name)));
  }
  return out;
}

/// Writes params.npy (every step) and the final state files, golden layout.
inline void write_case_outputs(const GoldenCase& c, const CaseRun& run, const std::filesystem::path& out) {
  std::filesystem::create_directories(out);
  std::vector<std::int64_t> seq = c.shape;
  seq.insert(seq.begin(), c.steps);
  write_npy(out / "params.npy", seq, run.params.data());
  for (const auto& [name, values] : run.state)
    write_npy(out / (name + ".npy"), detail::state_shape(name, c.shape), values.data());
}

}  // namespace skewadam::tools
