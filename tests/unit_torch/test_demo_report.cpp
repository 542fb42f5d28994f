// The demo's report (examples/moe_lm/report.hpp): the mean and spread over
// seeds, the tuned rows picked from the lr sweep, and the summary's verdict on
// the paper's two claims, from made-up runs whose answers are known.
// (DOCTEST_CHECK: report.hpp brings in LibTorch, whose glog has a CHECK of
// its own.)

#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "report.hpp"

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

}  // namespace test_demo_report
