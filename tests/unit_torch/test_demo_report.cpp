// The demo's report (examples/moe_lm/report.hpp): the mean and spread over
// seeds, the tuned rows picked from the lr sweep, and the summary's verdict on
// the paper's two claims, from made-up runs whose answers are known.
// (DOCTEST_CHECK: report.hpp brings in LibTorch, whose glog has a CHECK of
// its own.)

#include "doctest_torch.hpp"

#include <torch/csrc/autograd/utils/lambda_post_hook.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "memory_report.hpp"
#include "model.hpp"
#include "report.hpp"
#include "run.hpp"

namespace test_demo_report {

namespace {

moe_lm::RunResult run(const std::string& optimizer, double factor, std::uint64_t seed, double val_ppl,
                      double state_bytes) {
  moe_lm::RunResult r;
  r.optimizer = optimizer;
  r.factor = factor;
  r.seed = seed;
  r.tag = optimizer + "-" + std::to_string(seed);
  r.summary["val_ppl"] = std::to_string(val_ppl);
  r.summary["state_bytes"] = std::to_string(state_bytes);
  return r;
}

// Three seeds of each optimizer at the default lr, the baselines also at
// x0.5 and x2; val ppl = centre + {-spread, 0, +spread} (sd = spread).
struct Runs {
  moe_lm::Settings s;
  std::vector<moe_lm::RunResult> results;
  void add(const std::string& o, double factor, double centre, double spread, double bytes) {
    for (int k = 0; k < 3; ++k) results.push_back(run(o, factor, 1234 + k, centre + (k - 1) * spread, bytes));
  }
  Runs() {
    s.tune = true;
    s.tune_factors = {0.5, 1.0, 2.0};
  }
};

}  // namespace

TEST_CASE("demo report: mean and sample standard deviation over the seeds") {
  const moe_lm::Spread a = moe_lm::spread({1.0, 2.0, 3.0});
  DOCTEST_CHECK(a.mean == doctest::Approx(2.0));
  DOCTEST_CHECK(a.sd == doctest::Approx(1.0));
  DOCTEST_CHECK(a.n == 3);
  const moe_lm::Spread one = moe_lm::spread({5.0});
  DOCTEST_CHECK(one.mean == 5.0);
  DOCTEST_CHECK(std::isnan(one.sd));
}

TEST_CASE("demo report: a tuned row is the baseline at the lr of its lowest mean perplexity") {
  Runs r;
  r.add("skewadam", 1.0, 5.0, 0.01, 1e6);
  r.add("adamw", 0.5, 6.5, 0.01, 4e7);
  r.add("adamw", 1.0, 6.0, 0.01, 4e7);
  r.add("adamw", 2.0, 5.8, 0.01, 4e7);
  r.add("adafactor", 0.5, 5.9, 0.01, 2e5);
  r.add("adafactor", 1.0, 6.1, 0.01, 2e5);
  r.add("adafactor", 2.0, 6.3, 0.01, 2e5);
  r.add("uniform", 1.0, 5.0, 0.01, 2e7);
  const auto rows = moe_lm::table_rows(r.s, r.results);
  DOCTEST_REQUIRE(rows.size() == 6);  // four at the default lr, two tuned
  DOCTEST_CHECK_FALSE(rows[1].tuned);
  DOCTEST_CHECK(rows[1].factor == 1.0);
  DOCTEST_CHECK(rows[4].optimizer == "adamw");
  DOCTEST_CHECK(rows[4].tuned);
  DOCTEST_CHECK(rows[4].factor == 2.0);
  DOCTEST_CHECK(rows[4].lr == doctest::Approx(2.0 * r.s.lr));
  DOCTEST_CHECK(rows[4].of("val_ppl").mean == doctest::Approx(5.8));
  DOCTEST_CHECK(rows[5].optimizer == "adafactor");
  DOCTEST_CHECK(rows[5].factor == 0.5);
  DOCTEST_CHECK(rows[5].runs.size() == 3);
}

TEST_CASE("demo report: the summary supports a half only when the run's figures do") {
  Runs r;
  r.s.tune = false;
  SUBCASE("lower by more than one sd, state under 5 %: both halves") {
    r.add("skewadam", 1.0, 5.0, 0.05, 1e6);
    r.add("adamw", 1.0, 5.5, 0.05, 4e7);
    r.add("adafactor", 1.0, 6.0, 0.05, 2e5);
    r.add("uniform", 1.0, 5.0, 0.05, 2e7);
    const std::string text = moe_lm::claims(moe_lm::table_rows(r.s, r.results));
    DOCTEST_CHECK(text.find("keeps 2.5 % of AdamW's") != std::string::npos);
    DOCTEST_CHECK(text.find("This run supports both halves of the claim.") != std::string::npos);
    DOCTEST_CHECK(text.find("the experts' momentum buys nothing here") != std::string::npos);
  }
  SUBCASE("within one sd of AdamW: the perplexity half is not supported, and AdamW is named") {
    r.s.optimizers = {"skewadam", "adamw", "adafactor"};
    r.add("skewadam", 1.0, 5.0, 0.2, 1e6);
    r.add("adamw", 1.0, 5.1, 0.2, 4e7);
    r.add("adafactor", 1.0, 6.0, 0.05, 2e5);
    const std::string text = moe_lm::claims(moe_lm::table_rows(r.s, r.results));
    DOCTEST_CHECK(text.find("supports the memory half; it does not support the perplexity half") != std::string::npos);
    DOCTEST_CHECK(text.find("within one standard deviation of that of AdamW (torch).") != std::string::npos);
    DOCTEST_CHECK(text.find("Adafactor-like.") == std::string::npos);
  }
  SUBCASE("higher by more than one sd, and state over 5 %") {
    r.s.optimizers = {"skewadam", "adamw"};
    r.add("skewadam", 1.0, 6.0, 0.05, 3e6);
    r.add("adamw", 1.0, 5.0, 0.05, 4e7);
    const std::string text = moe_lm::claims(moe_lm::table_rows(r.s, r.results));
    DOCTEST_CHECK(text.find("does not reach the paper's memory share") != std::string::npos);
    DOCTEST_CHECK(text.find("higher than that of AdamW (torch) by more than one standard deviation") != std::string::npos);
  }
  SUBCASE("one seed leaves the gap unjudged") {
    r.s.optimizers = {"skewadam", "adamw"};
    r.results.push_back(run("skewadam", 1.0, 1234, 5.0, 1e6));
    r.results.push_back(run("adamw", 1.0, 1234, 6.0, 4e7));
    const std::string text = moe_lm::claims(moe_lm::table_rows(r.s, r.results));
    DOCTEST_CHECK(text.find("one seed leaves the gap to AdamW (torch) unjudged") != std::string::npos);
    DOCTEST_CHECK(text.find("supports both halves") == std::string::npos);
  }
}

TEST_CASE("demo report: bf16 and 8-bit momentum against fp32, judged by the seeds' spread") {
  Runs r;
  r.s.tune = false;
  r.s.optimizers = {"skewadam", "skewadam-bf16", "skewadam-8bit"};
  r.add("skewadam", 1.0, 5.0, 0.1, 1e6);
  r.add("skewadam-bf16", 1.0, 5.05, 0.1, 7e5);
  r.add("skewadam-8bit", 1.0, 5.5, 0.1, 4e5);
  const std::string text = moe_lm::momentum_storage_claim(moe_lm::table_rows(r.s, r.results));
  DOCTEST_CHECK(text.find("SkewAdam, bf16 momentum: 5.050 ± 0.100, state 0.700 MB, against fp32 momentum 5.000 ± "
                          "0.100, 1.000 MB: higher by 0.050, within one sd (0.100)") != std::string::npos);
  DOCTEST_CHECK(text.find("SkewAdam, 8-bit momentum: 5.500 ± 0.100, state 0.400 MB, against fp32 momentum 5.000 ± "
                          "0.100, 1.000 MB: higher by 0.500, more than one sd (0.100)") != std::string::npos);
  Runs none;  // without fp32 momentum, nothing to compare
  none.s.optimizers = {"skewadam-8bit"};
  none.add("skewadam-8bit", 1.0, 5.5, 0.1, 4e5);
  DOCTEST_CHECK(moe_lm::momentum_storage_claim(moe_lm::table_rows(none.s, none.results)).empty());
}

TEST_CASE("demo settings: --tune-factors takes each factor once, and always the default lr") {
  moe_lm::Settings s;
  const char* argv[] = {"moe_lm", "--tune-factors", "2,0.5,2"};
  DOCTEST_REQUIRE(moe_lm::parse(3, const_cast<char**>(argv), s));
  DOCTEST_CHECK(s.tune_factors == std::vector<double>{1.0, 2.0, 0.5});
  moe_lm::Settings bad;
  const char* zero[] = {"moe_lm", "--tune-factors", "1,0"};
  DOCTEST_CHECK_THROWS_WITH_AS(moe_lm::parse(3, const_cast<char**>(zero), bad), doctest::Contains("--tune-factors: '0'"),
                               std::invalid_argument);
}

TEST_CASE("demo settings: --warmup is a share of the steps; --eval-windows and --final-windows count windows") {
  moe_lm::Settings s;
  const char* argv[] = {"moe_lm", "--warmup", "0.25", "--eval-windows", "8", "--final-windows", "16"};
  DOCTEST_REQUIRE(moe_lm::parse(7, const_cast<char**>(argv), s));
  DOCTEST_CHECK(s.warmup == 0.25);
  DOCTEST_CHECK(s.eval_windows == 8);
  DOCTEST_CHECK(s.final_windows == 16);
  for (const char* v : {"1.5", "-0.1", "x"}) {
    moe_lm::Settings bad;
    const char* args[] = {"moe_lm", "--warmup", v};
    DOCTEST_CHECK_THROWS_WITH_AS(moe_lm::parse(3, const_cast<char**>(args), bad), doctest::Contains("--warmup"),
                                 std::invalid_argument);
    DOCTEST_CHECK(bad.warmup == moe_lm::Settings{}.warmup);
  }
  // a run of the schedule's first steps: the first 30 of a 300-step warm-up
  moe_lm::Settings part;
  const char* first[] = {"moe_lm", "--steps", "30", "--warmup-steps", "300", "--schedule-steps", "300", "--lr", "3e-4"};
  DOCTEST_REQUIRE(moe_lm::parse(9, const_cast<char**>(first), part));
  const skewadam::WarmupCosine w = moe_lm::schedule_of(part);
  DOCTEST_CHECK(w.warmup_steps == 300);
  DOCTEST_CHECK(w.total_steps == 300);
  DOCTEST_CHECK(w(30) == doctest::Approx(3e-5).epsilon(1e-12));
  DOCTEST_CHECK(moe_lm::schedule_of(s).warmup_steps == 200);  // 0.25 of the default 800 steps
  moe_lm::Settings few;
  const char* ten[] = {"moe_lm", "--steps", "10"};
  DOCTEST_REQUIRE(moe_lm::parse(3, const_cast<char**>(ten), few));
  DOCTEST_CHECK(moe_lm::schedule_of(few).warmup_steps == 1);  // 3 % of 10 steps: at least one
  for (const std::vector<const char*>& bad_args :
       {std::vector<const char*>{"moe_lm", "--steps", "30", "--schedule-steps", "20"},
        std::vector<const char*>{"moe_lm", "--steps", "30", "--warmup-steps", "31"}}) {
    moe_lm::Settings bad;
    DOCTEST_CHECK_THROWS_AS(moe_lm::parse(5, const_cast<char**>(bad_args.data()), bad), std::invalid_argument);
  }
  moe_lm::Settings none;
  const char* zero[] = {"moe_lm", "--final-windows", "0"};
  DOCTEST_CHECK_THROWS_WITH_AS(moe_lm::parse(3, const_cast<char**>(zero), none), doctest::Contains("--final-windows"),
                               std::invalid_argument);
}

TEST_CASE("demo settings: --in-backward names each library optimizer's in-backward run; AdamW has none") {
  moe_lm::Settings s;
  const char* argv[] = {"moe_lm", "--optimizers", "skewadam,adamw,adafactor", "--in-backward"};
  DOCTEST_REQUIRE(moe_lm::parse(4, const_cast<char**>(argv), s));
  DOCTEST_CHECK(s.optimizers ==
                std::vector<std::string>{"skewadam-in-backward", "adamw", "adafactor-in-backward"});
  DOCTEST_CHECK(moe_lm::rule_of("skewadam-in-backward") == "skewadam");
  DOCTEST_CHECK(moe_lm::in_backward("no-optimizer"));
  DOCTEST_CHECK_FALSE(moe_lm::in_backward("skewadam"));
  DOCTEST_CHECK(moe_lm::display_name("skewadam-in-backward") == "SkewAdam, step in backward");
  moe_lm::Settings bad;
  const char* adamw[] = {"moe_lm", "--optimizers", "adamw-in-backward"};
  DOCTEST_CHECK_THROWS_WITH_AS(moe_lm::parse(3, const_cast<char**>(adamw), bad),
                               doctest::Contains("unknown optimizer 'adamw-in-backward'"), std::invalid_argument);
}

TEST_CASE("demo settings: the momentum variants, and --lr 0") {
  moe_lm::Settings s;
  const char* argv[] = {"moe_lm", "--optimizers", "skewadam,skewadam-bf16,skewadam-8bit", "--in-backward", "--lr", "0"};
  DOCTEST_REQUIRE(moe_lm::parse(6, const_cast<char**>(argv), s));
  DOCTEST_CHECK(s.optimizers == std::vector<std::string>{"skewadam-in-backward", "skewadam-bf16-in-backward",
                                                         "skewadam-8bit-in-backward"});
  DOCTEST_CHECK(s.lr == 0.0);
  DOCTEST_CHECK(moe_lm::display_name("skewadam-8bit-in-backward") == "SkewAdam, 8-bit momentum, step in backward");
  moe_lm::Settings bad;
  const char* negative[] = {"moe_lm", "--lr", "-1e-3"};
  DOCTEST_CHECK_THROWS_WITH_AS(moe_lm::parse(3, const_cast<char**>(negative), bad),
                               doctest::Contains("--lr -1e-3: expected a number >= 0"), std::invalid_argument);
  // the paper preset trains SkewAdam with 8-bit momentum inside backward
  moe_lm::Settings paper;
  const char* preset[] = {"moe_lm", "--preset", "paper"};
  DOCTEST_REQUIRE(moe_lm::parse(3, const_cast<char**>(preset), paper));
  DOCTEST_CHECK(std::count(paper.optimizers.begin(), paper.optimizers.end(), "skewadam-8bit-in-backward") == 1);
}

TEST_CASE("demo memory: a run's need holds every gradient, or with the step inside backward the largest") {
  moe_lm::ModelConfig c;
  c.device = torch::kMeta;
  c.separate_experts = true;
  moe_lm::MoELM model(c);
  const skewadam::Plan plan = moe_lm::plan_of(*model);
  double all = 0, largest = 0;
  std::int64_t expert_tensors = 0;
  for (const auto& p : model->named_parameters()) {
    const double bytes = static_cast<double>(p.value().numel() * p.value().element_size());
    all += bytes;
    largest = std::max(largest, bytes);
    if (p.key().find(".experts.") != std::string::npos) {
      ++expert_tensors;
      DOCTEST_CHECK(p.value().dim() == 2);  // one expert's matrix, not a bank
    }
  }
  DOCTEST_CHECK(expert_tensors == 3 * c.experts);  // one MoE block: gate, up and down of each expert
  const moe_lm::MemoryNeed plain = moe_lm::memory_need(*model, plan, "skewadam", 1e6);
  const moe_lm::MemoryNeed ib = moe_lm::memory_need(*model, plan, "skewadam-in-backward", 1e6);
  const moe_lm::MemoryNeed none = moe_lm::memory_need(*model, plan, "no-optimizer", 1e6);
  DOCTEST_CHECK(plain.grads == all);
  DOCTEST_CHECK(ib.grads == largest);
  DOCTEST_CHECK(ib.state == static_cast<double>(plan.state_bytes.skewadam));
  DOCTEST_CHECK(none.state == 0.0);
  DOCTEST_CHECK(plain.total() == plain.weights + all + plain.state + 1e6);
  DOCTEST_CHECK(moe_lm::available_memory_bytes() > 0.0);
}

TEST_CASE("demo: the no-optimizer run drops every gradient inside backward, and only while it lives") {
  torch::manual_seed(3);
  auto a = torch::randn({4, 3}).requires_grad_();
  auto b = torch::randn({3}).requires_grad_();
  {
    moe_lm::GradientDropper dropper({a, b});
    (a.matmul(b).sum() + b.sum()).backward();
    DOCTEST_CHECK_FALSE(a.grad().defined());
    DOCTEST_CHECK_FALSE(b.grad().defined());
  }
  (a.matmul(b).sum()).backward();
  DOCTEST_CHECK(a.grad().defined());
  DOCTEST_CHECK(b.grad().defined());
}

TEST_CASE("demo settings: the paper's recipe: --accumulate for the whole step, --checkpoint, --in-backward-clip") {
  moe_lm::Settings s;
  const char* argv[] = {"moe_lm",       "--optimizers", "skewadam", "--batch", "16",
                        "--accumulate", "4",            "--checkpoint", "on"};
  DOCTEST_REQUIRE(moe_lm::parse(9, const_cast<char**>(argv), s));
  DOCTEST_CHECK(s.accumulate == 4);
  DOCTEST_CHECK(s.model.checkpoint);
  DOCTEST_CHECK(s.in_backward_clip == "none");
  auto refused = [](std::vector<const char*> args, const char* words) {
    moe_lm::Settings bad;
    DOCTEST_CHECK_THROWS_WITH_AS(moe_lm::parse(static_cast<int>(args.size()), const_cast<char**>(args.data()), bad),
                                 doctest::Contains(words), std::invalid_argument);
  };
  refused({"moe_lm", "--batch", "16", "--accumulate", "3"}, "--accumulate 3: does not divide --batch 16");
  refused({"moe_lm", "--in-backward-clip", "global"}, "--in-backward-clip global: expected previous or none");
  refused({"moe_lm", "--checkpoint", "yes"}, "--checkpoint yes: expected on or off");
  // the paper preset: 8,192 tokens a step, the paper's 300 warm-up steps, checkpointing
  moe_lm::Settings paper;
  const char* preset[] = {"moe_lm", "--preset", "paper"};
  DOCTEST_REQUIRE(moe_lm::parse(3, const_cast<char**>(preset), paper));
  DOCTEST_CHECK(paper.batch * paper.model.context == 8192);
  DOCTEST_CHECK(paper.model.checkpoint);
  DOCTEST_CHECK(moe_lm::schedule_of(paper).warmup_steps == 300);
}

TEST_CASE("demo model: activation checkpointing gives the plain loss and gradients, each complete once") {
  moe_lm::ModelConfig c;
  c.d_model = 32;
  c.heads = 4;
  c.context = 16;
  c.dense_ff = 48;
  c.experts = 4;
  c.expert_ff = 40;
  c.vocab = 256;
  c.head_chunk = 24;         // the head's loss in chunks, the last one shorter
  c.separate_experts = true;  // an expert no token reaches has no gradient, as in the plain model
  torch::manual_seed(11);
  moe_lm::MoELM plain(c);
  c.checkpoint = true;
  torch::manual_seed(11);
  moe_lm::MoELM checkpointed(c);
  const auto idx = torch::randint(0, 256, {5, 16}, torch::kLong);
  const auto targets = torch::randint(0, 256, {5, 16}, torch::kLong);
  // every parameter's gradient accumulator fires once: complete once, as the step inside backward needs
  std::map<std::string, int> completed;
  std::vector<std::pair<std::shared_ptr<torch::autograd::Node>, std::uintptr_t>> hooks;
  for (const auto& p : checkpointed->named_parameters()) {
    auto acc = torch::autograd::impl::grad_accumulator(p.value());
    const std::string name = p.key();
    hooks.emplace_back(acc, acc->add_post_hook(std::make_unique<torch::autograd::utils::LambdaPostHook>(
                                [&completed, name](const torch::autograd::variable_list& out,
                                                   const torch::autograd::variable_list&) {
                                  ++completed[name];
                                  return out;
                                })));
  }
  const moe_lm::LMLoss a = plain->loss(idx, targets);
  const moe_lm::LMLoss b = checkpointed->loss(idx, targets);
  DOCTEST_CHECK(a.loss.item<double>() == doctest::Approx(b.loss.item<double>()).epsilon(1e-6));
  DOCTEST_CHECK(a.balance_loss.item<double>() == doctest::Approx(b.balance_loss.item<double>()).epsilon(1e-6));
  DOCTEST_CHECK(a.expert_counts == b.expert_counts);
  (a.loss + 0.01 * a.balance_loss).backward();
  (b.loss + 0.01 * b.balance_loss).backward();
  const auto pa = plain->named_parameters(), pb = checkpointed->named_parameters();
  for (const auto& p : pa) {
    DOCTEST_CAPTURE(p.key());
    const torch::Tensor& ga = p.value().grad();
    const torch::Tensor& gb = pb[p.key()].grad();
    DOCTEST_REQUIRE(ga.defined() == gb.defined());
    if (ga.defined()) DOCTEST_CHECK(torch::allclose(ga, gb, 1e-4, 1e-6));
    DOCTEST_CHECK(completed[p.key()] == (ga.defined() ? 1 : completed[p.key()]));
  }
  for (auto& [node, key] : hooks) node->del_post_hook(key);
  // without autograd (evaluation) the chunked head gives the same loss
  torch::NoGradGuard no_grad;
  DOCTEST_CHECK(checkpointed->loss(idx, targets).loss.item<double>() ==
                doctest::Approx(a.loss.item<double>()).epsilon(1e-6));
}

}  // namespace test_demo_report
