#pragma once
// The compiled half of the Python package: one Engine per variant, over the
// LibTorch adapter (skewadam/torch/optimizer.hpp), which owns the library's
// optimizer for CPU or CUDA tensors. The variants share their methods
// (EngineBase, over the adapter's OptimizerBase), compiled and bound once. The Python half (skewadam/optim.py)
// keeps torch's param groups and hands each step their hyperparameters.
//
// Everything that crosses into Python is plain: names, tier and policy
// names as strings, tuples of hyperparameters, tensors. A bad argument raises
// std::invalid_argument naming it (ValueError in Python), and changes
// nothing.

#include <torch/extension.h>

#include <cstdint>
#include <cstring>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <tuple>
#include <unordered_map>
#include <utility>
#include <vector>

#include <skewadam/rules/rule_name.hpp>
#include <skewadam/torch/optimizer.hpp>

namespace skewadam::python {

namespace py = pybind11;

/// One tier's hyperparameters as Python passes them:
/// (lr, beta1, beta2, eps, weight_decay, clip_threshold, clip_scope).
using HyperTuple = std::tuple<double, double, double, double, double, double, std::string>;

inline Hyperparameters hyper_of(const HyperTuple& t, Tier tier) {
  Hyperparameters h;
  h.lr = std::get<0>(t);
  h.beta1 = std::get<1>(t);
  h.beta2 = std::get<2>(t);
  h.eps = std::get<3>(t);
  h.weight_decay = std::get<4>(t);
  h.clip_threshold = std::get<5>(t);
  const std::string where = std::string(tier_name(tier));
  h.clip_scope = parse_clip_scope(std::get<6>(t), where + ".clip_scope");
  validate(h, where);
  return h;
}

inline HyperTuple tuple_of(const Hyperparameters& h) {
  return {h.lr, h.beta1, h.beta2, h.eps, h.weight_decay, h.clip_threshold,
          h.clip_scope == ClipScope::matrix ? "matrix" : "tensor"};
}

/// The three tiers' hyperparameters, in the order backbone, experts, router.
inline PerTier<Hyperparameters> per_tier_of(const std::vector<HyperTuple>& v) {
  if (v.size() != static_cast<std::size_t>(tier_count))
    throw std::invalid_argument("hyperparameters: " + std::to_string(v.size()) + " tiers given, " +
                                std::to_string(tier_count) + " expected");
  PerTier<Hyperparameters> out;
  for (Tier t : all_tiers) out[t] = hyper_of(v[static_cast<std::size_t>(tier_index(t))], t);
  return out;
}

inline NonFinitePolicy policy_of(const std::string& s) {
  if (s == "skip") return NonFinitePolicy::skip_step;
  if (s == "raise") return NonFinitePolicy::raise;
  if (s == "unchecked") return NonFinitePolicy::unchecked;
  throw std::invalid_argument("nonfinite: '" + s + "' (expected skip, raise or unchecked)");
}

/// A host fp32 copy of `data` with `sizes` (an empty array: None).
inline py::object tensor_of(const std::vector<float>& data, const std::vector<std::int64_t>& sizes) {
  if (data.empty()) return py::none();
  at::Tensor t = at::empty(sizes, at::TensorOptions().dtype(at::kFloat));
  std::memcpy(t.data_ptr<float>(), data.data(), data.size() * sizeof(float));
  return py::cast(t);
}

/// The elements of a float32 tensor (or None: empty), for import_state.
inline std::vector<float> floats_of(const py::object& o, const std::string& who) {
  if (o.is_none()) return {};
  if (!THPVariable_Check(o.ptr())) throw std::invalid_argument(who + ": not a tensor");
  const at::Tensor t = o.cast<at::Tensor>();
  if (t.scalar_type() != at::kFloat)
    throw std::invalid_argument(who + ": dtype " + std::string(c10::toString(t.scalar_type())) + ", expected float32");
  const at::Tensor c = t.detach().to(at::kCPU).contiguous();
  return std::vector<float>(c.data_ptr<float>(), c.data_ptr<float>() + c.numel());
}

/// What every variant's engine does, over the adapter's OptimizerBase: bound
/// once (as the Python class Engine), each variant's class (Engine<Tiers>)
/// adding its constructor alone.
class EngineBase {
 public:
  virtual ~EngineBase() = default;

  /// One step with these hyperparameters (the param groups' now).
  void step(const std::vector<HyperTuple>& hyper) {
    set_hyperparameters(hyper);
    const py::gil_scoped_release release;
    opt_.step();
  }

  /// The step inside backward of one parameter (its hook's), with these
  /// hyperparameters; step() then ends the optimizer step.
  void step_parameter(const std::string& name, const std::vector<HyperTuple>& hyper) {
    if (!opt_.engine_core().step_open()) set_hyperparameters(hyper);
    const py::gil_scoped_release release;
    opt_.step_parameter(name);
  }
  bool step_open() const { return opt_.engine_core().step_open(); }
  /// Ends a step inside backward left open (zero_grad() calls it first).
  void end_open_step() {
    const py::gil_scoped_release release;
    opt_.end_open_step();
  }
  void check_step_inside_backward() const { opt_.check_step_inside_backward(); }

  /// (applied, name, element, value, message, interrupted, stepped,
  /// not_stepped, skipped, measured) of the last step.
  using ReportTuple = std::tuple<bool, std::optional<std::string>, std::int64_t, double, std::string, bool,
                                 std::int64_t, std::vector<std::string>, std::int64_t, bool>;
  ReportTuple last_step() const {
    const StepReport& r = opt_.last_step();
    std::string message = r.applied ? "applied" : "skipped";
    if (r.measured)
      message = "measured the global gradient norm that the next step clips by (clip_norm=\"previous\" had none): "
                "nothing updated";
    std::optional<std::string> name;
    std::int64_t element = -1;
    double value = 0.0;
    if (!r.applied && r.nonfinite) {
      const NonFiniteGradient& n = *r.nonfinite;
      name = n.name;
      element = static_cast<std::int64_t>(n.element);
      value = static_cast<double>(n.value);
      message = n.describe();
      if (r.skipped > 1) message += " (and " + std::to_string(r.skipped - 1) + " more tensors skipped)";
    }
    if (r.interrupted)
      message += "; backward raised part way: " + std::to_string(r.stepped) + " tensors stepped, " +
                 std::to_string(r.not_stepped.size()) + " not";
    return {r.applied, name, element, value, message, r.interrupted, static_cast<std::int64_t>(r.stepped),
            r.not_stepped, static_cast<std::int64_t>(r.skipped), r.measured};
  }

  std::vector<std::string> names() const { return opt_.names(); }
  std::string tier(const std::string& name) const { return std::string(tier_name(opt_.tier(name))); }
  std::int64_t steps() const { return opt_.steps(); }
  std::uint64_t seed() const { return opt_.seed(); }
  std::string device() const { return opt_.device().str(); }
  std::int64_t state_bytes() const { return static_cast<std::int64_t>(opt_.state_bytes()); }
  std::int64_t tier_state_bytes(const std::string& tier) const {
    return static_cast<std::int64_t>(opt_.state_bytes(parse_tier(tier, "tier")));
  }
  /// {tier: the name of its rule}, as checkpoints record it.
  std::unordered_map<std::string, std::string> rules() const {
    std::unordered_map<std::string, std::string> r;
    for (Tier t : all_tiers) r.emplace(std::string(tier_name(t)), opt_.tier_facts(t).rule);
    return r;
  }

  /// The tensors that view a parameter's state in place: {m, v, v_row, v_col}
  /// (absent arrays: None), and its step count.
  py::dict param_state(const std::string& name) const {
    const libtorch::ParamState& s = opt_.param_state(name);
    py::dict d;
    d["step"] = s.step;
    for (auto [key, t] : {std::pair{"m", &s.m}, std::pair{"v", &s.v}, std::pair{"v_row", &s.v_row},
                          std::pair{"v_col", &s.v_col}})
      d[key] = t->defined() ? py::cast(*t) : py::none();
    return d;
  }

  /// A parameter's first moment decoded to float32 in its shape (None
  /// without momentum).
  py::object momentum(const std::string& name) const {
    at::Tensor m;
    {
      const py::gil_scoped_release release;
      m = opt_.momentum(name);
    }
    return m.defined() ? py::cast(m) : py::none();
  }

  /// The complete state, host copies: {steps, seed, hyper: [3 tuples],
  /// params: [{name, step, rounding_stream, m, v, v_row, v_col}]} in
  /// registration order, each array in its logical shape.
  py::dict export_state() const {
    OptimizerState s;
    {
      const py::gil_scoped_release release;
      s = opt_.export_state();
    }
    const std::vector<std::string> names = opt_.names();
    py::list params;
    for (std::size_t i = 0; i < s.params.size(); ++i) {
      const auto& p = s.params[i];
      const libtorch::detail::StateShapes shapes =
          libtorch::detail::state_shapes(opt_.shape(names[i]), opt_.tier_facts(opt_.tier(names[i])).layout);
      py::dict d;
      d["name"] = names[i];
      d["step"] = p.state.step;
      d["rounding_stream"] = p.rounding_stream;
      d["m"] = tensor_of(p.state.m, shapes.m);
      d["v"] = tensor_of(p.state.v, shapes.full);
      d["v_row"] = tensor_of(p.state.v_row, shapes.rows);
      d["v_col"] = tensor_of(p.state.v_col, shapes.cols);
      params.append(d);
    }
    py::list hyper;
    for (Tier t : all_tiers) hyper.append(tuple_of(s.hyperparameters[static_cast<std::size_t>(tier_index(t))]));
    py::dict out;
    out["steps"] = s.steps;
    out["seed"] = s.seed;
    out["previous_grad_norm"] = s.previous_grad_norm;
    out["hyper"] = hyper;
    out["params"] = params;
    return out;
  }

  /// Replaces the complete state; `params` as export_state() gives them, in
  /// registration order. All or nothing.
  void import_state(std::int64_t steps, std::uint64_t seed, const std::vector<HyperTuple>& hyper,
                    const py::list& params, double previous_grad_norm) {
    OptimizerState s;
    s.steps = steps;
    s.seed = seed;
    s.previous_grad_norm = previous_grad_norm;
    const PerTier<Hyperparameters> h = per_tier_of(hyper);
    for (Tier t : all_tiers) s.hyperparameters[static_cast<std::size_t>(tier_index(t))] = h[t];
    const std::vector<std::string> names = opt_.names();
    if (params.size() != names.size())
      throw std::invalid_argument("state: " + std::to_string(params.size()) + " parameters, the optimizer has " +
                                  std::to_string(names.size()));
    for (std::size_t i = 0; i < names.size(); ++i) {
      const py::dict d = params[i].cast<py::dict>();
      const std::string who = "state of '" + names[i] + "'";
      OptimizerState::Param p;
      p.state.step = d["step"].cast<std::int64_t>();
      p.rounding_stream = d["rounding_stream"].cast<std::uint32_t>();
      p.state.m = floats_of(d["m"], who + ".m");
      p.state.v = floats_of(d["v"], who + ".v");
      p.state.v_row = floats_of(d["v_row"], who + ".v_row");
      p.state.v_col = floats_of(d["v_col"], who + ".v_col");
      s.params.push_back(std::move(p));
    }
    const py::gil_scoped_release release;
    opt_.import_state(std::move(s));
  }

  /// Writes the library's checkpoint file with these hyperparameters (the
  /// param groups' now); include_params also stores the parameter values.
  void save_checkpoint(const std::string& path, const std::vector<HyperTuple>& hyper, bool include_params) {
    set_hyperparameters(hyper);
    const py::gil_scoped_release release;
    opt_.save_checkpoint(path, SaveOptions{.include_params = include_params});
  }

  /// Loads a checkpoint file (and the parameter values it holds); all or
  /// nothing.
  void load_checkpoint(const std::string& path) {
    const py::gil_scoped_release release;
    opt_.load_checkpoint(path);
  }

  /// The tiers' hyperparameters the optimizer holds (after a load: the
  /// file's), in the order backbone, experts, router.
  std::vector<HyperTuple> hyperparameters() const {
    std::vector<HyperTuple> out;
    for (Tier t : all_tiers) out.push_back(tuple_of(opt_.group_options(t).hyperparameters()));
    return out;
  }

 protected:
  explicit EngineBase(std::unique_ptr<libtorch::OptimizerBase> opt) : owned_(std::move(opt)), opt_(*owned_) {}

  /// The adapter's options from what Python passes.
  static libtorch::Options options(const std::vector<std::pair<std::string, std::string>>& tier_rules,
                                   const std::vector<HyperTuple>& hyper, double max_grad_norm,
                                   const std::string& clip_norm, const std::string& nonfinite, std::uint64_t seed,
                                   int threads) {
    libtorch::Options o;
    o.hyperparameters = per_tier_of(hyper);
    std::vector<TierRule> rules;
    for (std::size_t i = 0; i < tier_rules.size(); ++i) {
      const std::string arg = "tier_rules[" + std::to_string(i) + "]";
      rules.emplace_back(tier_rules[i].first, parse_tier(tier_rules[i].second, arg), arg);
    }
    o.tier_rules = TierAssigner(std::move(rules));
    o.max_grad_norm = max_grad_norm;
    o.clip_norm = parse_clip_norm(clip_norm, "clip_norm");
    o.nonfinite = policy_of(nonfinite);
    o.seed = seed;
    o.threads = threads;
    return o;
  }

 private:
  /// The param groups' hyperparameters (checked) as the adapter's groups'.
  void set_hyperparameters(const std::vector<HyperTuple>& hyper) {
    const PerTier<Hyperparameters> h = per_tier_of(hyper);
    for (Tier t : all_tiers) opt_.group_options(t).hyperparameters() = h[t];
  }

  std::unique_ptr<libtorch::OptimizerBase> owned_;
  libtorch::OptimizerBase& opt_;
};

/// The engine of one variant: the adapter of Tiers.
template <class Tiers>
class Engine : public EngineBase {
 public:
  Engine(const std::vector<std::pair<std::string, at::Tensor>>& named,
         const std::vector<std::pair<std::string, std::string>>& tier_rules, const std::vector<HyperTuple>& hyper,
         double max_grad_norm, const std::string& clip_norm, const std::string& nonfinite, std::uint64_t seed,
         int threads)
      : EngineBase(std::make_unique<libtorch::Optimizer<Tiers>>(
            named, options(tier_rules, hyper, max_grad_norm, clip_norm, nonfinite, seed, threads))) {}
};

/// Binds EngineBase, once, as the Python class Engine of module m.
void bind_engine_base(py::module_& m);

/// Binds Engine<Tiers> as the Python class `name` of module m: its
/// constructor; the methods are Engine's (bind_engine_base).
template <class Tiers>
void bind_engine(py::module_& m, const char* name) {
  py::class_<Engine<Tiers>, EngineBase>(m, name)
      .def(py::init<const std::vector<std::pair<std::string, at::Tensor>>&,
                    const std::vector<std::pair<std::string, std::string>>&, const std::vector<HyperTuple>&, double,
                    const std::string&, const std::string&, std::uint64_t, int>(),
           py::arg("named_parameters"), py::arg("tier_rules"), py::arg("hyper"), py::arg("max_grad_norm"),
           py::arg("clip_norm"), py::arg("nonfinite"), py::arg("seed"), py::arg("threads"));
}

}  // namespace skewadam::python
