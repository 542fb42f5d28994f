#pragma once
// Golden conformance cases (format skewadam-golden/1): loading, running
// through the rule the case's flags name, comparing, and writing outputs in
// the same layout. Shared by skewadam-replay and the test suite.

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include <skewadam/skewadam.hpp>

#include "npy.hpp"

namespace skewadam::tools {

class CaseError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

struct Tolerance {
  double rtol = 0;
  double atol = 0;
};

struct GoldenCase {
  std::filesystem::path dir;
  std::string name;
  std::string description;
  std::vector<std::int64_t> shape;
  std::int64_t steps = 0;
  bool momentum = false;
  bool factored = false;
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
};

namespace detail {

inline Tolerance parse_tolerance(const nlohmann::json& j, const std::string& where) {
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
    c.tolerance = detail::parse_tolerance(j.at("tolerance"), where + ": tolerance");
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

/// What a run computed: the parameter after every step and the final state.
struct CaseRun {
  std::vector<float> params;                           ///< steps * numel
  std::map<std::string, std::vector<float>> state;    ///< exp_avg, v, v_row, v_col
};

/// Runs steps [first, last) of a case on `opt` (the case's parameter already
/// registered as `id`, pointing at `param`), recording into run.params.
template <class Opt>
void run_golden_steps(const GoldenCase& c, Opt& opt, ParamId id, std::vector<float>& param, std::int64_t first,
                      std::int64_t last, CaseRun& run) {
  const std::int64_t n = c.numel();
  const Shape shape(c.shape.begin(), static_cast<index_t>(c.shape.size()), "case shape");
  run.params.resize(static_cast<std::size_t>(c.steps * n));
  for (std::int64_t t = first; t < last; ++t) {
    opt.set_grad(id, TensorView<const float>(c.grads.data.data() + t * n, shape));
    opt.set_lr(c.lr_schedule[static_cast<std::size_t>(t)]);
    opt.step();
    std::copy(param.begin(), param.end(), run.params.begin() + t * n);
  }
}

/// The final state of the case's parameter, from export_state() (so that it
/// works on every placement; sharded, it is collective).
template <class Opt>
void collect_state(const Opt& opt, ParamId id, CaseRun& run) {
  const ParamState s = opt.export_state().params[static_cast<std::size_t>(id.index)].state;
  run.state.clear();
  if (!s.m.empty()) run.state["exp_avg"] = s.m;
  if (!s.v.empty()) run.state["v"] = s.v;
  if (!s.v_row.empty()) run.state["v_row"] = s.v_row;
  if (!s.v_col.empty()) run.state["v_col"] = s.v_col;
}

/// Calls f.template operator()<Rule>() with the rule the case's flags name.
template <class F>
decltype(auto) with_case_rule(const GoldenCase& c, F&& f) {
  if (c.momentum && c.factored) return f.template operator()<BackboneRule>();
  if (c.momentum) return f.template operator()<ExactMomentumRule>();
  if (c.factored) return f.template operator()<ExpertRule>();
  return f.template operator()<RouterRule>();
}

/// Runs a whole case from a fresh state, as the golden README says, on the
/// optimizer `make.template operator()<Tiers>(hyper)` returns (a pointer-like
/// owner of any front-end configuration).
template <class Make>
CaseRun run_golden_case_on(const GoldenCase& c, Make&& make) {
  return with_case_rule(c, [&]<class Rule>() {
    auto opt = make.template operator()<TierRules<Rule, Rule, Rule>>(c.hyper);
    std::vector<float> param = c.param0.data;
    const Shape shape(c.shape.begin(), static_cast<index_t>(c.shape.size()), "case shape");
    const ParamId id = opt->add(c.name.empty() ? "param" : c.name, Tier::backbone, TensorView<float>(param.data(), shape));
    CaseRun run;
    run_golden_steps(c, *opt, id, param, 0, c.steps, run);
    collect_state(*opt, id, run);
    return run;
  });
}

/// The same on the local placement of a CPU backend.
template <class Backend = backend::DefaultBackend>
CaseRun run_golden_case(const GoldenCase& c, int threads = 1) {
  return run_golden_case_on(c, [&]<class Tiers>(const Hyperparameters& h) {
    return std::make_unique<Optimizer<Tiers, Backend>>(h, OptimizerOptions{.threads = threads});
  });
}

/// Worst error of one array as a fraction of its tolerance (<= 1 passes).
struct ArrayCheck {
  std::string array;
  double worst = 0;          ///< max |got - expected| / (atol + rtol |expected|)
  std::int64_t worst_index = -1;
  bool ok = false;
  std::string problem;       ///< set when sizes differ or values are not finite
};

inline ArrayCheck compare_array(const std::string& name, const std::vector<float>& got, const std::vector<float>& expected,
                                Tolerance tol) {
  ArrayCheck r;
  r.array = name;
  if (got.size() != expected.size()) {
    r.problem = "has " + std::to_string(got.size()) + " values, expected " + std::to_string(expected.size());
    r.worst = INFINITY;
    return r;
  }
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

inline std::vector<ArrayCheck> check_golden_case(const GoldenCase& c, const CaseRun& run) {
  std::vector<ArrayCheck> out;
  out.push_back(compare_array("params", run.params, c.params.data, c.tolerance));
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
