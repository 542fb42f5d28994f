#pragma once
// The behaviour every front-end configuration (backend x placement) must
// show, written once. A translation unit defines its configurations and
// SKEWADAM_CONTRACT_CONFIGURATIONS (a comma-separated list of them), then
// includes this file: tests/unit/test_contract.cpp (CPU, sharded over the
// self communicator, and at three ranks, each a thread of the process:
// support/thread_ranks.hpp), tests/emulation/test_contract_cuda_emulated.cpp
// (the CUDA engine over the emulated runtime: local, sharded at one rank, and
// at three ranks in threads).
//
// A configuration is a type with a name, make<Tiers>(hyper, options)
// returning an owner of a fresh optimizer, its checkpoint functions save /
// load, cpu_bits: whether it must give the local CPU configuration's
// bits (the CUDA kernels reduce in another order, so the CUDA engine agrees
// within the golden tolerances instead; so do ranks that add a cut matrix's
// column sums in another grouping), cuts_matrices: whether it cuts matrices
// into row slices between ranks (each slice keeps the column statistics of
// its rows, so the backbone's state, every rank's summed, is larger than one
// process's by them), and emulated: whether its kernels run slowly on an
// emulation of their device (sweeps then use smaller models where the large
// one adds no path).
//
// Asserted for each: every golden case; the local CPU configuration's bits
// (or, without cpu_bits, its values within tolerance); a checkpoint moves
// between it and the CPU configuration, both ways, exactly; a resumed run
// (export/import, and through a checkpoint file) repeats an uninterrupted
// one bit for bit; a non-finite gradient skips the step with the same report
// (last_step()) and changes nothing (raise: step() throws it); clipping
// equals stepping with pre-scaled gradients, bit for bit, and max_grad_norm
// equals clip_grad_norm before each step; the step inside backward
// (step(ParamId), finish_step()) gives the whole step's bits under every rule
// alias, skips a non-finite tensor alone and refuses what needs every
// gradient; bad input is refused with a message naming the argument and
// nothing changed.

#ifndef SKEWADAM_CONTRACT_CONFIGURATIONS
#error "define SKEWADAM_CONTRACT_CONFIGURATIONS before including contract_suite.hpp"
#endif

#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <limits>
#include <memory>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include <skewadam/checkpoint.hpp>
#include <skewadam/skewadam.hpp>
#include <skewadam_tools/golden_case.hpp>

#include "golden_dirs.hpp"
#include "training_fixture.hpp"

namespace skewadam::contract {

// ------------------------------------------------------------ configurations
struct CpuLocal {
  static constexpr const char* name = "CPU";
  static constexpr bool cpu_bits = true;
  static constexpr bool cuts_matrices = false;
  static constexpr bool emulated = false;
  template <class Tiers>
  static auto make(const PerTier<Hyperparameters>& h, OptimizerOptions o) {
    return std::make_unique<Optimizer<Tiers>>(h, o);
  }
  template <class Opt>
  static void save(const Opt& opt, const std::filesystem::path& f) {
    save_checkpoint(opt, f);
  }
  template <class Opt>
  static void load(Opt& opt, const std::filesystem::path& f) {
    load_checkpoint(opt, f);
  }
};

// ------------------------------------------------------------------- helpers
PerTier<Hyperparameters> hyper() { return fixture::tier_hyper(); }

template <class Config>
auto make(NonFinitePolicy policy = NonFinitePolicy::skip_step) {
  auto opt = Config::template make<SkewAdamTiers>(hyper(),
                                                  OptimizerOptions{.seed = 1234, .threads = 2, .nonfinite = policy});
  opt->set_lr_schedule(Tier::backbone, WarmupCosine{.peak_lr = 1e-2, .warmup_steps = 2, .total_steps = 10});
  return opt;
}

/// Everything observable: parameter bits and the exported state, in the
/// model's tensor order (whatever the order of registration).
struct Observed {
  std::vector<std::vector<unsigned char>> params;
  std::vector<OptimizerState::Param> state;
  std::int64_t steps = 0;
  std::uint64_t seed = 0;

  template <class Opt>
  static Observed take(fixture::Model& m, const Opt& opt) {
    Observed o;
    const OptimizerState s = opt.export_state();
    for (fixture::Tensor& t : m.tensors) {
      o.params.push_back(t.bits());
      o.state.push_back(s.params.at(static_cast<std::size_t>(opt.find(t.name)->index)));
    }
    o.steps = s.steps;
    o.seed = s.seed;
    return o;
  }
  friend bool operator==(const Observed& a, const Observed& b) {
    auto same = [](const std::vector<float>& x, const std::vector<float>& y) {
      return x.size() == y.size() && (x.empty() || std::memcmp(x.data(), y.data(), 4 * x.size()) == 0);
    };
    if (a.params != b.params || a.steps != b.steps || a.seed != b.seed || a.state.size() != b.state.size())
      return false;
    for (std::size_t i = 0; i < a.state.size(); ++i) {
      const ParamState& x = a.state[i].state;
      const ParamState& y = b.state[i].state;
      if (x.step != y.step || a.state[i].rounding_stream != b.state[i].rounding_stream || !same(x.m, y.m) ||
          !same(x.v, y.v) || !same(x.v_row, y.v_row) || !same(x.v_col, y.v_col))
        return false;
    }
    return true;
  }
};

/// a and b within the golden tolerances (1e-6 + 2e-5 |x| for parameters
/// and state alike), with the same step counts and streams. Parameters are
/// compared as fp32 values (the fp32 model).
inline bool close(const Observed& a, const Observed& b) {
  auto near = [](const float* x, const float* y, std::size_t n) {
    for (std::size_t i = 0; i < n; ++i)
      if (!(std::fabs(double(x[i]) - double(y[i])) <= 1e-6 + 2e-5 * std::fabs(double(y[i])))) return false;
    return true;
  };
  if (a.steps != b.steps || a.seed != b.seed || a.params.size() != b.params.size() || a.state.size() != b.state.size())
    return false;
  for (std::size_t i = 0; i < a.params.size(); ++i) {
    if (a.params[i].size() != b.params[i].size() || a.params[i].size() % 4 != 0) return false;
    std::vector<float> x(a.params[i].size() / 4), y(x.size());
    if (!x.empty()) {
      std::memcpy(x.data(), a.params[i].data(), a.params[i].size());
      std::memcpy(y.data(), b.params[i].data(), b.params[i].size());
    }
    if (!near(x.data(), y.data(), x.size())) return false;
  }
  for (std::size_t i = 0; i < a.state.size(); ++i) {
    const ParamState& x = a.state[i].state;
    const ParamState& y = b.state[i].state;
    if (x.step != y.step || a.state[i].rounding_stream != b.state[i].rounding_stream) return false;
    for (auto [p, q] : {std::pair{&x.m, &y.m}, {&x.v, &y.v}, {&x.v_row, &y.v_row}, {&x.v_col, &y.v_col}})
      if (p->size() != q->size() || !near(p->data(), q->data(), p->size())) return false;
  }
  return true;
}

/// Sets element `at` of tensor k's gradient (in its own dtype).
void poke_grad(fixture::Tensor& t, std::size_t at, float value) {
  if (!t.g32.empty()) t.g32[at] = value;
  if (!t.gb.empty()) t.gb[at] = bf16(value);
  if (!t.gh.empty()) t.gh[at] = f16(value);
}

/// Sets every gradient of step t (the fixture's schedule of which tensors have one).
template <class Opt>
void set_grads(fixture::Model& m, Opt& opt, const std::vector<ParamId>& ids, std::int64_t t) {
  for (std::size_t i = 0; i < m.tensors.size(); ++i) {
    fixture::Tensor& x = m.tensors[i];
    if (t % x.grad_every == 0) {
      x.fill_grad(i + 1, t);
      opt.set_grad(ids[i], x.grad());
    } else {
      opt.clear_grad(ids[i]);
    }
  }
}

std::filesystem::path scratch_file(const std::string& name) {
  const auto dir = std::filesystem::temp_directory_path() / "skewadam-contract";
  std::filesystem::create_directories(dir);
  return dir / name;
}

/// One optimizer step taken inside backward: each tensor with a gradient at
/// step t is stepped alone (step(ParamId)), in backward's order (the last
/// registered first), and the step is then finished.
template <class Opt>
StepReport step_in_backward(fixture::Model& m, Opt& opt, const std::vector<ParamId>& ids, std::int64_t t) {
  for (std::size_t k = m.tensors.size(); k-- > 0;) {
    fixture::Tensor& x = m.tensors[k];
    opt.clear_grad(ids[k]);
    if (t % x.grad_every != 0) continue;
    x.fill_grad(k + 1, t);
    opt.set_grad(ids[k], x.grad());
    opt.step(ids[k]);
    opt.clear_grad(ids[k]);  // as a hook frees it
  }
  return opt.finish_step();
}


/// Local and Sharded at one rank over the same backend give the same bits,
/// under tensor-scope and matrix-scope clipping alike: Local's clip divisors
/// are formed by the backend, Sharded's by the engine, and both sum a
/// tensor's matrices in one order. Banks of many matrices whose gradients
/// span six decades, so that another order of the tensor-scope sum shows.
template <class LocalConfig, class ShardedConfig>
void local_and_sharded_at_one_rank_agree() {
  struct Tensor {
    const char* name;
    Tier tier;
    Shape shape;
    std::vector<float> param, grad;
  };
  for (const ClipScope scope : {ClipScope::tensor, ClipScope::matrix}) {
    INFO("clip scope: ", scope == ClipScope::tensor ? "tensor" : "matrix");
    PerTier<Hyperparameters> h = hyper();
    for (Tier t : all_tiers) h[t].clip_scope = scope;
    std::vector<Tensor> model = {{"backbone.w", Tier::backbone, Shape{40, 48}, {}, {}},
                                 {"experts.w", Tier::experts, Shape{96, 24, 20}, {}, {}},
                                 {"router.bank", Tier::router, Shape{96, 4, 16}, {}, {}}};
    std::uint64_t key = 0;
    auto uniform = [&] { return 0.5 * (1.0 + fixture::uniform(++key)); };  // in [0, 1)
    for (Tensor& t : model) {
      t.param.resize(static_cast<std::size_t>(t.shape.numel()));
      t.grad.resize(t.param.size());
      for (float& x : t.param) x = static_cast<float>(uniform() - 0.5);
    }
    std::vector<Tensor> copy = model;
    auto local = LocalConfig::template make<SkewAdamTiers>(h, OptimizerOptions{.seed = 77, .threads = 2});
    auto sharded = ShardedConfig::template make<SkewAdamTiers>(h, OptimizerOptions{.seed = 77, .threads = 2});
    for (std::size_t i = 0; i < model.size(); ++i) {
      local->add(model[i].name, model[i].tier, TensorView<float>(model[i].param.data(), model[i].shape),
                 TensorView<const float>(model[i].grad.data(), model[i].shape));
      sharded->add(copy[i].name, copy[i].tier, TensorView<float>(copy[i].param.data(), copy[i].shape),
                   TensorView<const float>(copy[i].grad.data(), copy[i].shape));
    }
    for (int step = 0; step < 6; ++step) {
      for (std::size_t i = 0; i < model.size(); ++i) {
        const index_t per_matrix = model[i].shape.matrices().matrix_size();
        double decade = 0;
        for (std::size_t e = 0; e < model[i].grad.size(); ++e) {
          if (static_cast<index_t>(e) % per_matrix == 0) decade = std::pow(10.0, 6.0 * uniform() - 4.0);
          model[i].grad[e] = copy[i].grad[e] = static_cast<float>((uniform() - 0.5) * decade);
        }
      }
      local->step();
      sharded->step();
    }
    const OptimizerState a = local->export_state(), b = sharded->export_state();
    for (std::size_t i = 0; i < model.size(); ++i) {
      INFO("tensor ", model[i].name);
      CHECK(std::memcmp(model[i].param.data(), copy[i].param.data(), 4 * model[i].param.size()) == 0);
      const ParamState &x = a.params[i].state, &y = b.params[i].state;
      CHECK(x.m == y.m);
      CHECK(x.v == y.v);
      CHECK(x.v_row == y.v_row);
      CHECK(x.v_col == y.v_col);
    }
  }
}

}  // namespace skewadam::contract

// The test cases, in the suite's namespace (a unity build includes this file
// beside other tests' sources).
namespace skewadam::contract {

template <class Config>
void every_golden_case(const std::vector<std::filesystem::path>& cases) {
  INFO("configuration: ", Config::name);
  REQUIRE(!cases.empty());
  for (const auto& dir : cases) {
    INFO("case ", dir.string());
    const tools::GoldenCase c = tools::load_golden_case(dir);
    const tools::CaseRun run =
        tools::run_golden_case_on(c, []<class Tiers>(const Hyperparameters& h, OptimizerOptions o) {
          o.threads = 2;
          return Config::template make<Tiers>(PerTier<Hyperparameters>{h, h, h}, o);
        });
    for (const tools::ArrayCheck& a : tools::check_golden_case(c, run)) {
      INFO(a.array, ": worst error ", a.worst, " of the tolerance ", a.problem, a.detail);
      CHECK(a.ok);
    }
  }
}

TEST_CASE_TEMPLATE("contract: every golden case", Config, SKEWADAM_CONTRACT_CONFIGURATIONS) {
  every_golden_case<Config>(skewadam::test::golden_cases());
}

#if defined(SKEWADAM_GOLDEN_EXTERNAL_DIR)
TEST_CASE_TEMPLATE("contract: every golden-external case", Config, SKEWADAM_CONTRACT_CONFIGURATIONS) {
  every_golden_case<Config>(skewadam::test::external_golden_cases());
}
#endif

TEST_CASE_TEMPLATE("contract: the local CPU configuration's bits", Config, SKEWADAM_CONTRACT_CONFIGURATIONS) {
  INFO("configuration: ", Config::name);
  // bits: bf16 weights (stochastic rounding); values: fp32 ones
  const Dtype weights = Config::cpu_bits ? Dtype::bf16 : Dtype::f32;
  fixture::Model a = fixture::Model::make(weights), b = a;
  auto ref = make<CpuLocal>();
  auto opt = make<Config>();
  const auto ia = a.register_with(*ref);
  const auto ib = b.register_with(*opt);
  a.train(*ref, ia, 0, 5);
  b.train(*opt, ib, 0, 5);
  if constexpr (Config::cuts_matrices) {
    // the experts are dealt out whole and the router's rule keeps no column
    // statistics: only the backbone's cut matrices hold more
    CHECK(opt->state_bytes(Tier::backbone) > ref->state_bytes(Tier::backbone));
    CHECK(opt->state_bytes(Tier::experts) == ref->state_bytes(Tier::experts));
    CHECK(opt->state_bytes(Tier::router) == ref->state_bytes(Tier::router));
  } else {
    CHECK(opt->state_bytes() == ref->state_bytes());
    for (Tier t : all_tiers) CHECK(opt->state_bytes(t) == ref->state_bytes(t));
  }
  if constexpr (Config::cpu_bits) {
    CHECK(Observed::take(a, *ref) == Observed::take(b, *opt));
    // the same state makes the same checkpoint file, byte for byte
    const std::filesystem::path mine = scratch_file(std::string("same-") + Config::name + ".ckpt");
    const std::filesystem::path theirs = scratch_file("same-reference.ckpt");
    Config::save(*opt, mine);
    CpuLocal::save(*ref, theirs);
    auto bytes = [](const std::filesystem::path& f) {
      std::ifstream in(f, std::ios::binary);
      return std::vector<char>(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
    };
    const std::vector<char> x = bytes(mine), y = bytes(theirs);
    CHECK(x.size() > 0);
    CHECK(x == y);
  } else {
    CHECK(close(Observed::take(a, *ref), Observed::take(b, *opt)));
  }
}

TEST_CASE_TEMPLATE("contract: a checkpoint moves between this configuration and the CPU one, exactly", Config,
                   SKEWADAM_CONTRACT_CONFIGURATIONS) {
  INFO("configuration: ", Config::name);
  fixture::Model a = fixture::Model::make(Dtype::bf16);
  auto cpu = make<CpuLocal>();
  const auto ia = a.register_with(*cpu);
  a.train(*cpu, ia, 0, 3);
  const std::filesystem::path there = scratch_file(std::string("to-") + Config::name + ".ckpt");
  CpuLocal::save(*cpu, there);

  fixture::Model b = a;  // the same parameter values
  auto opt = make<Config>();
  const auto ib = b.register_with(*opt, /*reversed=*/true);
  Config::load(*opt, there);
  CHECK(Observed::take(b, *opt) == Observed::take(a, *cpu));

  b.train(*opt, ib, 3, 5);
  const std::filesystem::path back = scratch_file(std::string("from-") + Config::name + ".ckpt");
  Config::save(*opt, back);
  fixture::Model c = b;
  auto again = make<CpuLocal>();
  (void)c.register_with(*again);
  CpuLocal::load(*again, back);
  CHECK(Observed::take(c, *again) == Observed::take(b, *opt));
}

TEST_CASE_TEMPLATE("contract: a resumed run repeats an uninterrupted one bit for bit", Config, SKEWADAM_CONTRACT_CONFIGURATIONS) {
  INFO("configuration: ", Config::name);
  for (bool through_file : {false, true}) {
    const char* how = through_file ? "through a checkpoint file" : "through export_state / import_state";
    INFO(how);
    fixture::Model whole = fixture::Model::make(Dtype::bf16), part = whole;
    auto uninterrupted = make<Config>();
    const auto iw = whole.register_with(*uninterrupted);
    whole.train(*uninterrupted, iw, 0, 6);

    auto first = make<Config>();
    const auto ip = part.register_with(*first);
    part.train(*first, ip, 0, 3);
    const std::filesystem::path file = scratch_file(std::string("resume-") + Config::name + ".ckpt");
    OptimizerState saved;
    if (through_file) Config::save(*first, file);
    else saved = first->export_state();
    first.reset();

    auto resumed = make<Config>();
    // a checkpoint matches parameters by name: register them in another order
    const auto ir = part.register_with(*resumed, /*reversed=*/through_file);
    if (through_file) Config::load(*resumed, file);
    else resumed->import_state(saved);
    CHECK(resumed->steps() == 3);
    part.train(*resumed, ir, 3, 6);
    CHECK(Observed::take(part, *resumed) == Observed::take(whole, *uninterrupted));
  }
}

TEST_CASE_TEMPLATE("contract: a non-finite gradient skips the step, reports it, changes nothing", Config,
                   SKEWADAM_CONTRACT_CONFIGURATIONS) {
  INFO("configuration: ", Config::name);
  const float bad_values[] = {std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::infinity(),
                              -std::numeric_limits<float>::infinity()};
  for (std::size_t k : {std::size_t{1}, std::size_t{3}, std::size_t{6}}) {  // backbone, experts, router
    for (float bad : bad_values) {
      fixture::Model m = fixture::Model::make(Dtype::bf16);
      auto opt = make<Config>();
      const auto ids = m.register_with(*opt);
      m.train(*opt, ids, 0, 2);
      set_grads(m, *opt, ids, 3);
      fixture::Tensor& t = m.tensors[k];
      const std::size_t at = static_cast<std::size_t>(t.numel() / 2 + 1);
      poke_grad(t, at, bad);
      const Observed before = Observed::take(m, *opt);
      INFO("tensor ", t.name, ", value ", bad);
      opt->step();
      const StepReport r = opt->last_step();
      CHECK_FALSE(r.applied);
      REQUIRE(r.nonfinite.has_value());
      CHECK(r.nonfinite->name == t.name);
      CHECK(r.nonfinite->param == ids[k]);
      CHECK(r.nonfinite->element == static_cast<index_t>(at));
      CHECK(std::isnan(r.nonfinite->value) == std::isnan(bad));
      if (!std::isnan(bad)) CHECK(r.nonfinite->value == bad);
      CHECK(Observed::take(m, *opt) == before);
      CHECK(opt->steps() == 2);
      // the repaired gradient steps as if nothing had happened
      set_grads(m, *opt, ids, 3);
      opt->step();
      CHECK(opt->last_step().applied);
      CHECK(opt->steps() == 3);
    }
  }
  SUBCASE("raise: throws the same report, changes nothing") {
    fixture::Model m = fixture::Model::make(Dtype::f32);
    auto opt = make<Config>(NonFinitePolicy::raise);
    const auto ids = m.register_with(*opt);
    m.train(*opt, ids, 0, 1);
    set_grads(m, *opt, ids, 2);
    poke_grad(m.tensors[3], 5, std::numeric_limits<float>::infinity());
    const Observed before = Observed::take(m, *opt);
    try {
      opt->step();
      FAIL("step() did not throw");
    } catch (const NonFiniteGradientError& e) {
      CHECK(e.report().name == m.tensors[3].name);
      CHECK(e.report().element == 5);
      CHECK(std::string(e.what()).find("+inf") != std::string::npos);
    }
    CHECK(Observed::take(m, *opt) == before);
  }
}

TEST_CASE_TEMPLATE("contract: clipping equals stepping with pre-scaled gradients, bit for bit", Config,
                   SKEWADAM_CONTRACT_CONFIGURATIONS) {
  INFO("configuration: ", Config::name);
  fixture::Model a = fixture::Model::make(Dtype::f32), b = a;  // every gradient fp32
  auto clipped = make<Config>();
  auto scaled = make<Config>();
  const auto ia = a.register_with(*clipped);
  const auto ib = b.register_with(*scaled);
  for (std::int64_t t = 1; t <= 3; ++t) {
    set_grads(a, *clipped, ia, t);
    set_grads(b, *scaled, ib, t);
    double sum = 0;  // the norm, in double
    for (std::size_t i = 0; i < a.tensors.size(); ++i)
      if (clipped->grad(ia[i]).present())
        for (float g : a.tensors[i].g32) sum += static_cast<double>(g) * static_cast<double>(g);
    const double max_norm = 0.25 * std::sqrt(sum);
    const double norm = clipped->clip_grad_norm(max_norm);
    CHECK(norm == doctest::Approx(std::sqrt(sum)).epsilon(1e-12));
    const double scale = max_norm / (norm + 1e-6);
    CHECK(clipped->pending_grad_scale() == scale);
    const auto s = static_cast<float>(scale);
    for (std::size_t i = 0; i < b.tensors.size(); ++i)
      for (float& g : b.tensors[i].g32) g *= s;
    clipped->step();
    scaled->step();
    REQUIRE(clipped->last_step().applied);
    REQUIRE(scaled->last_step().applied);
    CHECK(clipped->pending_grad_scale() == 1.0);
  }
  CHECK(Observed::take(a, *clipped) == Observed::take(b, *scaled));
}

TEST_CASE_TEMPLATE("contract: max_grad_norm clips every step as clip_grad_norm before each step does, bit for bit",
                   Config, SKEWADAM_CONTRACT_CONFIGURATIONS) {
  INFO("configuration: ", Config::name);
  fixture::Model a = fixture::Model::make(Dtype::bf16), b = a;
  auto every = make<Config>();
  auto manual = make<Config>();
  const auto ia = a.register_with(*every);
  const auto ib = b.register_with(*manual);
  CHECK(std::isnan(every->last_grad_norm()));
  every->set_max_grad_norm(0.75);
  for (std::int64_t t = 1; t <= 4; ++t) {
    CAPTURE(t);
    set_grads(a, *every, ia, t);
    set_grads(b, *manual, ib, t);
    const double norm = manual->clip_grad_norm(0.75);
    REQUIRE(manual->pending_grad_scale() < 1.0);  // the clip bites
    manual->step();
    every->step();
    CHECK(every->last_grad_norm() == norm);
    CHECK(every->pending_grad_scale() == 1.0);
  }
  CHECK(Observed::take(a, *every) == Observed::take(b, *manual));
  every->set_max_grad_norm(0);  // off again: plain steps
  set_grads(a, *every, ia, 5);
  set_grads(b, *manual, ib, 5);
  every->step();
  manual->step();
  CHECK(Observed::take(a, *every) == Observed::take(b, *manual));
  for (double bad : {-1.0, std::nan(""), std::numeric_limits<double>::infinity()}) {
    try {
      every->set_max_grad_norm(bad);
      FAIL("accepted max_grad_norm = ", bad);
    } catch (const std::invalid_argument& e) {
      CHECK(std::string(e.what()).find("max_grad_norm") != std::string::npos);
    }
    CHECK(every->max_grad_norm() == 0.0);
  }
}

TEST_CASE_TEMPLATE("contract: bad input is refused, naming the argument, and nothing changes", Config,
                   SKEWADAM_CONTRACT_CONFIGURATIONS) {
  INFO("configuration: ", Config::name);
  fixture::Model m = fixture::Model::make(Dtype::bf16, /*large=*/false);
  auto opt = make<Config>();
  const auto ids = m.register_with(*opt);
  m.train(*opt, ids, 0, 2);
  const Observed before = Observed::take(m, *opt);
  const index_t registered = opt->size();
  auto refused = [&](auto&& f, const std::string& words) {
    try {
      f();
      FAIL("accepted: ", words);
    } catch (const std::invalid_argument& e) {
      INFO("message: ", e.what());
      CHECK(std::string(e.what()).find(words) != std::string::npos);
    }
    CHECK(opt->size() == registered);
    CHECK(Observed::take(m, *opt) == before);
  };
  std::vector<float> w(12 * 8), g(12 * 8), g_wrong(8 * 12);
  fixture::Tensor& embed = m.tensors[0];
  refused([&] { opt->add("", Tier::backbone, TensorView<float>(w.data(), {12, 8})); }, "name");
  refused([&] { opt->add(embed.name, Tier::backbone, TensorView<float>(w.data(), {12, 8})); }, embed.name);
  refused([&] {
    opt->add("w", Tier::backbone, TensorView<float>(w.data(), {12, 8}), TensorView<const float>(g_wrong.data(), {8, 12}));
  }, "grad of 'w'");
  refused([&] { opt->add("alias", Tier::experts, embed.param()); }, "overlaps parameter '" + embed.name + "'");
  refused([&] { opt->add("w", static_cast<Tier>(7), TensorView<float>(w.data(), {12, 8})); }, "tier of 'w'");
  refused([&] { opt->set_grad(ids[0], TensorView<const float>(g.data(), {12, 8})); }, "grad of '" + embed.name + "'");
  refused([&] { opt->set_grad(ParamId{99}, GradView{}); }, "param id 99");
  const OptimizerState good = opt->export_state();
  refused([&] {
    OptimizerState s = good;
    s.params[1].state.v_row.pop_back();
    opt->import_state(s);
  }, "v_row");
  refused([&] {
    OptimizerState s = good;
    s.params[0].state.step = s.steps + 1;
    opt->import_state(s);
  }, "step");
  refused([&] { opt->set_threads(-1); }, "threads");
  refused([&] { opt->clip_grad_norm(-1.0); }, "max_norm");
  set_grads(m, *opt, ids, 3);
  opt->set_lr_schedule(Tier::router, [](std::int64_t) { return std::nan(""); });
  const Observed with_grads = Observed::take(m, *opt);
  try {
    opt->step();
    FAIL("a NaN learning rate was accepted");
  } catch (const std::invalid_argument& e) {
    CHECK(std::string(e.what()).find("lr schedule of tier router") != std::string::npos);
  }
  CHECK(Observed::take(m, *opt) == with_grads);
}

template <class Config, class Tiers>
void in_backward_matches_whole_step(const char* alias, bool large = true) {
  INFO("rule alias: ", alias);
  auto make_one = [] {
    auto opt = Config::template make<Tiers>(hyper(), OptimizerOptions{.seed = 99, .threads = 2});
    opt->set_lr_schedule(Tier::backbone, WarmupCosine{.peak_lr = 1e-2, .warmup_steps = 2, .total_steps = 10});
    return opt;
  };
  fixture::Model a = fixture::Model::make(Dtype::bf16, large), b = a;
  auto whole = make_one();
  auto inside = make_one();
  const auto ia = a.register_with(*whole);
  const auto ib = b.register_with(*inside);
  for (std::int64_t t = 1; t <= 4; ++t) {
    CAPTURE(t);
    a.train(*whole, ia, t - 1, t);
    CHECK_FALSE(inside->step_open());
    const StepReport r = step_in_backward(b, *inside, ib, t);
    CHECK(r.applied);
    CHECK(r.skipped == 0);
    CHECK_FALSE(inside->step_open());
    CHECK(inside->last_step().applied);
    CHECK(inside->steps() == t);
    REQUIRE(Observed::take(b, *inside) == Observed::take(a, *whole));
  }
  // and the two modes mix: a whole step after steps inside backward
  a.train(*whole, ia, 4, 6);
  b.train(*inside, ib, 4, 6);
  CHECK(Observed::take(b, *inside) == Observed::take(a, *whole));
}

TEST_CASE_TEMPLATE("contract: the step inside backward gives the whole step's bits, under every rule alias", Config,
                   SKEWADAM_CONTRACT_CONFIGURATIONS) {
  INFO("configuration: ", Config::name);
  // SkewAdam and its 8-bit momentum on the large model (tensors of several
  // row blocks and chunks, cut between ranks when sharded); every alias on
  // it where a step is cheap, on the small model where it is emulated
  constexpr bool large = !Config::emulated;
  in_backward_matches_whole_step<Config, SkewAdamTiers>("SkewAdam");
  in_backward_matches_whole_step<Config, ExpertMomentumTiers>("ExpertMomentumAblation", large);
  in_backward_matches_whole_step<Config, FactoredRouterTiers>("FactoredRouterAblation", large);
  in_backward_matches_whole_step<Config, UniformTiers>("UniformAblation", large);
  in_backward_matches_whole_step<Config, AdafactorTiers>("AdafactorLike", large);
  in_backward_matches_whole_step<Config, ExactExpertsTiers>("ExactExpertsAblation", large);
  in_backward_matches_whole_step<Config, AdamWTiers>("AdamW", large);
  in_backward_matches_whole_step<Config, SkewAdamBf16Tiers>("SkewAdam, bf16 momentum", large);
  in_backward_matches_whole_step<Config, SkewAdam8bitTiers>("SkewAdam, 8-bit momentum");
}

TEST_CASE_TEMPLATE("contract: inside backward, a non-finite gradient skips its tensor alone and is reported", Config,
                   SKEWADAM_CONTRACT_CONFIGURATIONS) {
  INFO("configuration: ", Config::name);
  for (std::size_t k : {std::size_t{1}, std::size_t{3}, std::size_t{6}}) {  // backbone, experts, router
    // the skipped tensor ends as if it had no gradient in that step
    fixture::Model a = fixture::Model::make(Dtype::bf16), b = a;
    auto inside = make<Config>();
    auto whole = make<Config>();
    const auto ia = a.register_with(*inside);
    const auto ib = b.register_with(*whole);
    for (std::int64_t t = 1; t <= 2; ++t) {
      (void)step_in_backward(a, *inside, ia, t);
      b.train(*whole, ib, t - 1, t);
    }
    fixture::Tensor& x = a.tensors[k];
    INFO("tensor ", x.name);
    const std::size_t at = static_cast<std::size_t>(x.numel() / 3);
    for (std::size_t i = a.tensors.size(); i-- > 0;) {
      fixture::Tensor& y = a.tensors[i];
      if (3 % y.grad_every != 0) continue;
      y.fill_grad(i + 1, 3);
      if (i == k) poke_grad(y, at, std::numeric_limits<float>::quiet_NaN());
      inside->set_grad(ia[i], y.grad());
      inside->step(ia[i]);
      inside->clear_grad(ia[i]);
    }
    const StepReport r = inside->finish_step();
    CHECK_FALSE(r.applied);
    CHECK(r.skipped == 1);
    REQUIRE(r.nonfinite.has_value());
    CHECK(r.nonfinite->name == x.name);
    CHECK(r.nonfinite->element == static_cast<index_t>(at));
    CHECK(std::isnan(r.nonfinite->value));
    CHECK(inside->last_step().skipped == 1);
    CHECK(inside->steps() == 3);
    set_grads(b, *whole, ib, 3);
    whole->clear_grad(ib[k]);
    whole->step();
    CHECK(Observed::take(a, *inside) == Observed::take(b, *whole));
    CHECK(inside->step_count(ia[k]) == 2);
  }
  SUBCASE("raise: that tensor's step throws, changes nothing, and can be stepped again") {
    fixture::Model a = fixture::Model::make(Dtype::f32), b = a;
    auto inside = make<Config>(NonFinitePolicy::raise);
    auto whole = make<Config>(NonFinitePolicy::raise);
    const auto ia = a.register_with(*inside);
    const auto ib = b.register_with(*whole);
    fixture::Tensor& x = a.tensors[3];
    x.fill_grad(4, 1);
    poke_grad(x, 5, std::numeric_limits<float>::infinity());
    inside->set_grad(ia[3], x.grad());
    try {
      inside->step(ia[3]);
      FAIL("step(ParamId) did not throw");
    } catch (const NonFiniteGradientError& e) {
      CHECK(e.report().name == x.name);
      CHECK(e.report().element == 5);
    }
    CHECK_FALSE(inside->stepped_in_open_step(ia[3]));
    CHECK(inside->step_count(ia[3]) == 0);
    // the repaired gradient, then the rest: the whole step's bits
    for (std::size_t i = a.tensors.size(); i-- > 0;) {
      if (1 % a.tensors[i].grad_every != 0) continue;
      a.tensors[i].fill_grad(i + 1, 1);
      inside->set_grad(ia[i], a.tensors[i].grad());
      inside->step(ia[i]);
    }
    CHECK(inside->finish_step().applied);
    b.train(*whole, ib, 0, 1);
    CHECK(Observed::take(a, *inside) == Observed::take(b, *whole));
  }
}

TEST_CASE_TEMPLATE("contract: the step inside backward refuses what needs every gradient, and misuse", Config,
                   SKEWADAM_CONTRACT_CONFIGURATIONS) {
  INFO("configuration: ", Config::name);
  fixture::Model m = fixture::Model::make(Dtype::bf16, /*large=*/false);
  auto opt = make<Config>();
  const auto ids = m.register_with(*opt);
  m.train(*opt, ids, 0, 1);
  set_grads(m, *opt, ids, 2);
  const Observed before = Observed::take(m, *opt);
  auto refused = [&]<class E>(auto&& f, const std::string& words, E*) {
    try {
      f();
      FAIL("accepted: ", words);
    } catch (const E& e) {
      INFO("message: ", e.what());
      CHECK(std::string(e.what()).find(words) != std::string::npos);
    }
  };
  constexpr std::invalid_argument* bad_argument = nullptr;
  constexpr std::logic_error* bad_state = nullptr;
  opt->set_max_grad_norm(1.0);
  refused([&] { opt->check_step_inside_backward(); }, "max_grad_norm", bad_argument);
  refused([&] { opt->step(ids[0]); }, "max_grad_norm", bad_argument);
  opt->set_max_grad_norm(0);
  (void)opt->clip_grad_norm(1e-3);
  refused([&] { opt->check_step_inside_backward(); }, "clip_grad_norm", bad_argument);
  refused([&] { opt->step(ids[0]); }, "clip_grad_norm", bad_argument);
  CHECK_FALSE(opt->step_open());
  CHECK(Observed::take(m, *opt) == before);
  opt->step();  // the pending scale is used (and consumed) by a whole step
  m.train(*opt, ids, 1, 2);
  refused([&] { opt->finish_step(); }, "no step is open", bad_state);
  refused([&] { opt->step(ParamId{42}); }, "param id 42", bad_argument);
  opt->clear_grad(ids[0]);
  refused([&] { opt->step(ids[0]); }, "grad of '" + m.tensors[0].name + "': absent", bad_argument);
  set_grads(m, *opt, ids, 3);
  opt->step(ids[1]);
  CHECK(opt->step_open());
  CHECK(opt->stepped_in_open_step(ids[1]));
  CHECK_FALSE(opt->stepped_in_open_step(ids[0]));
  refused([&] { opt->step(ids[1]); }, "already stepped", bad_argument);
  refused([&] { opt->step(); }, "step(): a step inside backward is open", bad_state);
  refused([&] { (void)opt->export_state(); }, "export_state", bad_state);
  refused([&] { Config::save(*opt, scratch_file("open.ckpt")); }, "save_checkpoint", bad_state);
  CHECK(opt->steps() == 3);
  opt->check_step_inside_backward();  // nothing refused now
  CHECK(opt->finish_step().applied);
  CHECK(opt->steps() == 4);
  CHECK(opt->step_count(ids[1]) == 4);
  CHECK(opt->step_count(ids[0]) == 3);
}

TEST_CASE_TEMPLATE("contract: a step inside backward cut short ends with a report, and training goes on", Config,
                   SKEWADAM_CONTRACT_CONFIGURATIONS) {
  INFO("configuration: ", Config::name);
  // backward raises after three tensors: what they got stays, the step counts,
  // the report names what was left, and the next steps are the whole step's
  // (the whole run: the same step with only those three gradients)
  for (NonFinitePolicy policy : {NonFinitePolicy::skip_step, NonFinitePolicy::raise}) {
    INFO("policy ", nonfinite_policy_name(policy));
    fixture::Model a = fixture::Model::make(Dtype::bf16, /*large=*/false), b = a;
    auto inside = make<Config>(policy);
    auto whole = make<Config>(policy);
    const auto ia = a.register_with(*inside);
    const auto ib = b.register_with(*whole);
    (void)step_in_backward(a, *inside, ia, 1);
    b.train(*whole, ib, 0, 1);
    const std::size_t n = a.tensors.size();
    std::vector<std::string> left;
    for (std::size_t k = 0; k + 3 < n; ++k) left.push_back(a.tensors[k].name);
    for (std::size_t k = n; k-- > n - 3;) {
      a.tensors[k].fill_grad(k + 1, 2);
      inside->set_grad(ia[k], a.tensors[k].grad());
      inside->step(ia[k]);
      inside->clear_grad(ia[k]);
    }
    CHECK(inside->step_open());
    const StepReport r = inside->finish_step(StepEnd::interrupted);
    CHECK(r.interrupted);
    CHECK(r.applied);
    CHECK(r.stepped == 3);
    CHECK(r.not_stepped == left);
    CHECK(inside->last_step().interrupted);
    CHECK_FALSE(inside->step_open());
    CHECK(inside->steps() == 2);
    CHECK(inside->step_count(ia[n - 1]) == 2);
    CHECK(inside->step_count(ia[0]) == 1);
    for (std::size_t k = 0; k < n; ++k) {
      whole->clear_grad(ib[k]);
      if (k + 3 >= n) {
        b.tensors[k].fill_grad(k + 1, 2);
        whole->set_grad(ib[k], b.tensors[k].grad());
      }
    }
    whole->step();
    CHECK_FALSE(whole->last_step().interrupted);
    CHECK(whole->last_step().stepped == 3);
    CHECK(Observed::take(a, *inside) == Observed::take(b, *whole));
    // training goes on: a whole step, then a step inside backward
    a.train(*inside, ia, 2, 3);
    b.train(*whole, ib, 2, 3);
    const StepReport next = step_in_backward(a, *inside, ia, 4);
    CHECK_FALSE(next.interrupted);
    b.train(*whole, ib, 3, 4);
    CHECK(Observed::take(a, *inside) == Observed::take(b, *whole));
    // an idle tensor (no gradient at step 5) is reported as not stepped
    const StepReport idle = step_in_backward(a, *inside, ia, 5);
    b.train(*whole, ib, 4, 5);
    std::vector<std::string> idle_names;
    for (const fixture::Tensor& x : a.tensors)
      if (5 % x.grad_every != 0) idle_names.push_back(x.name);
    CHECK(idle.not_stepped == idle_names);
    CHECK(idle.stepped == static_cast<index_t>(n - idle_names.size()));
    CHECK(Observed::take(a, *inside) == Observed::take(b, *whole));
  }
}


// ------------------------------------- clipping by the previous step's norm (E8)

/// The naive sum of g^2 in double over every present fp32 gradient of step
/// t: what the previous step's norm must be close to.
inline double naive_norm(const fixture::Model& m, std::int64_t t) {
  double sum = 0;
  for (const fixture::Tensor& x : m.tensors)
    if (t % x.grad_every == 0)
      for (float g : x.g32) sum += static_cast<double>(g) * static_cast<double>(g);
  return std::sqrt(sum);
}

template <class Config>
auto make_previous(double max_norm, NonFinitePolicy policy = NonFinitePolicy::skip_step) {
  auto opt = make<Config>(policy);
  opt->set_max_grad_norm(max_norm, ClipNorm::previous);
  return opt;
}

TEST_CASE_TEMPLATE("contract: clipping by the previous step's norm is the whole step's inside backward, and scales "
                   "each step by the last step's norm, bit for bit",
                   Config, SKEWADAM_CONTRACT_CONFIGURATIONS) {
  INFO("configuration: ", Config::name);
  fixture::Model a = fixture::Model::make(Dtype::f32), b = a, c = a, d = a;  // every gradient fp32
  double max_norm = 0;
  {
    auto probe = make<Config>();
    const auto ids = a.register_with(*probe);
    set_grads(a, *probe, ids, 1);
    max_norm = 0.5 * probe->grad_norm();  // bites on every step after the first
  }
  auto whole = make_previous<Config>(max_norm);
  auto inside = make_previous<Config>(max_norm);
  auto scaled = make<Config>();  // no clip: its gradients are scaled by hand
  const auto ia = a.register_with(*whole);
  const auto ib = b.register_with(*inside);
  const auto ic = c.register_with(*scaled, /*reversed=*/true);
  CHECK(whole->clips_by_previous_norm());
  inside->check_step_inside_backward();  // accepted: nothing needs every gradient
  CHECK(std::isnan(whole->previous_grad_norm()));
  const Observed fresh = Observed::take(a, *whole);
  for (std::int64_t t = 1; t <= 5; ++t) {
    CAPTURE(t);
    const double before = whole->previous_grad_norm();
    if (t > 1) {  // the first step, with no norm before it, only measures it
      const double scale = max_norm / (before + 1e-6);
      CHECK(scale < 1.0);
      set_grads(c, *scaled, ic, t);
      for (fixture::Tensor& x : c.tensors)
        for (float& g : x.g32) g *= static_cast<float>(scale);
      scaled->step();
    }
    a.train(*whole, ia, t - 1, t);
    const StepReport r = step_in_backward(b, *inside, ib, t);
    CHECK(r.applied == (t > 1));
    CHECK(r.measured == (t == 1));
    CHECK(whole->last_step().applied == (t > 1));
    CHECK(whole->last_step().measured == (t == 1));
    if (t == 1) {
      const auto with_grad = std::count_if(b.tensors.begin(), b.tensors.end(),
                                           [](const fixture::Tensor& x) { return 1 % x.grad_every == 0; });
      CHECK(r.stepped == static_cast<index_t>(with_grad));
      CHECK(whole->steps() == 0);
      CHECK(inside->steps() == 0);
      CHECK(Observed::take(a, *whole) == fresh);  // nothing updated or counted
    }
    CHECK(whole->previous_grad_norm() == inside->previous_grad_norm());
    CHECK(whole->previous_grad_norm() == doctest::Approx(naive_norm(a, t)).epsilon(1e-12));
    CHECK(whole->last_grad_norm() == whole->previous_grad_norm());
  }
  CHECK(Observed::take(b, *inside) == Observed::take(a, *whole));
  CHECK(Observed::take(c, *scaled) == Observed::take(a, *whole));
  // the local CPU configuration's bits (or values, as the plain step's)
  auto ref = make_previous<CpuLocal>(max_norm);
  const auto id = d.register_with(*ref);
  d.train(*ref, id, 0, 5);
  if constexpr (Config::cpu_bits) {
    CHECK(ref->previous_grad_norm() == whole->previous_grad_norm());
    CHECK(Observed::take(d, *ref) == Observed::take(a, *whole));
  } else {
    CHECK(ref->previous_grad_norm() == doctest::Approx(whole->previous_grad_norm()).epsilon(1e-12));
    CHECK(close(Observed::take(d, *ref), Observed::take(a, *whole)));
  }
  // a step without it leaves no norm: the next one clipped by it is not clipped
  whole->set_max_grad_norm(0);
  a.train(*whole, ia, 5, 6);
  CHECK(std::isnan(whole->previous_grad_norm()));
  CHECK(std::isnan(whole->export_state().previous_grad_norm));
}

TEST_CASE_TEMPLATE("contract: the previous step's norm resumes bit for bit, in another registration order", Config,
                   SKEWADAM_CONTRACT_CONFIGURATIONS) {
  INFO("configuration: ", Config::name);
  for (bool through_file : {false, true}) {
    const char* how = through_file ? "through a checkpoint file" : "through export_state / import_state";
    INFO(how);
    fixture::Model whole = fixture::Model::make(Dtype::bf16), part = whole;
    double max_norm = 0;
    {
      auto probe = make<Config>();
      const auto ids = whole.register_with(*probe);
      set_grads(whole, *probe, ids, 1);
      max_norm = 0.5 * probe->grad_norm();
    }
    auto uninterrupted = make_previous<Config>(max_norm);
    const auto iw = whole.register_with(*uninterrupted);
    whole.train(*uninterrupted, iw, 0, 6);

    auto first = make_previous<Config>(max_norm);
    const auto ip = part.register_with(*first);
    for (std::int64_t t = 1; t <= 3; ++t) (void)step_in_backward(part, *first, ip, t);
    const double carried = first->previous_grad_norm();
    REQUIRE(carried > max_norm);
    const std::filesystem::path file = scratch_file(std::string("previous-norm-") + Config::name + ".ckpt");
    OptimizerState saved;
    if (through_file) Config::save(*first, file);
    else saved = first->export_state();
    if (!through_file) CHECK(saved.previous_grad_norm == carried);
    first.reset();

    auto resumed = make_previous<Config>(max_norm);
    // a checkpoint matches parameters by name: register them in another order
    const auto ir = part.register_with(*resumed, /*reversed=*/through_file);
    if (through_file) Config::load(*resumed, file);
    else resumed->import_state(saved);
    CHECK(resumed->previous_grad_norm() == carried);
    part.train(*resumed, ir, 3, 6);
    CHECK(resumed->previous_grad_norm() == uninterrupted->previous_grad_norm());
    CHECK(Observed::take(part, *resumed) == Observed::take(whole, *uninterrupted));
  }
}

TEST_CASE_TEMPLATE("contract: under the previous step's norm a skipped tensor or step leaves no sum, and bad input "
                   "changes nothing",
                   Config, SKEWADAM_CONTRACT_CONFIGURATIONS) {
  INFO("configuration: ", Config::name);
  fixture::Model a = fixture::Model::make(Dtype::f32, /*large=*/false), b = a;
  auto nan_in = make_previous<Config>(1e-3);
  auto without = make_previous<Config>(1e-3);
  const auto ia = a.register_with(*nan_in);
  const auto ib = b.register_with(*without);
  for (std::int64_t t = 1; t <= 2; ++t) {
    (void)step_in_backward(a, *nan_in, ia, t);
    (void)step_in_backward(b, *without, ib, t);
  }
  // inside backward: tensor k's gradient holds a NaN in one, none in the other
  const std::size_t k = 3;
  for (std::size_t i = a.tensors.size(); i-- > 0;) {
    a.tensors[i].fill_grad(i + 1, 3);
    b.tensors[i].fill_grad(i + 1, 3);
    if (i == k) poke_grad(a.tensors[i], 2, std::numeric_limits<float>::quiet_NaN());
    nan_in->set_grad(ia[i], a.tensors[i].grad());
    nan_in->step(ia[i]);
    if (i == k) continue;
    without->set_grad(ib[i], b.tensors[i].grad());
    without->step(ib[i]);
  }
  CHECK(nan_in->finish_step().skipped == 1);
  CHECK(without->finish_step().applied);
  CHECK(nan_in->previous_grad_norm() == without->previous_grad_norm());
  CHECK(Observed::take(a, *nan_in) == Observed::take(b, *without));

  // the whole step, rejected for a non-finite gradient: the norm stays
  const double kept = nan_in->previous_grad_norm();
  set_grads(a, *nan_in, ia, 4);
  poke_grad(a.tensors[1], 0, std::numeric_limits<float>::infinity());
  nan_in->step();
  CHECK_FALSE(nan_in->last_step().applied);
  CHECK(nan_in->previous_grad_norm() == kept);

  // refused, nothing changed
  const OptimizerState good = nan_in->export_state();
  for (double bad : {-1.0, std::numeric_limits<double>::infinity()}) {
    OptimizerState s = good;
    s.previous_grad_norm = bad;
    CHECK_THROWS_WITH_AS(nan_in->import_state(s), doctest::Contains("previous_grad_norm"), std::invalid_argument);
  }
  CHECK(nan_in->previous_grad_norm() == kept);
  CHECK_THROWS_WITH_AS(nan_in->set_max_grad_norm(1.0, static_cast<ClipNorm>(7)), doctest::Contains("clip_norm"),
                       std::invalid_argument);
  CHECK(nan_in->clip_norm() == ClipNorm::previous);
  set_grads(a, *nan_in, ia, 5);
  nan_in->step(ia[0]);
  CHECK_THROWS_WITH_AS(nan_in->set_max_grad_norm(1.0), doctest::Contains("set_max_grad_norm"), std::logic_error);
  CHECK(nan_in->clip_norm() == ClipNorm::previous);
  (void)nan_in->finish_step();
}

}  // namespace skewadam::contract
