#pragma once
// moe_lm's report: the runs of every optimizer (several seeds, and a
// learning-rate sweep of the baselines with --tune) gathered into one row
// per optimizer (mean and standard deviation over the seeds), the table, the
// lr sweep, the summary of what the run shows of the paper's two claims, and
// the CSV files and plot.

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iomanip>
#include <iostream>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "settings.hpp"

namespace moe_lm {

/// One finished run: what the worker wrote, and its peak resident memory.
struct RunResult {
  std::string optimizer;
  double factor = 1.0;  ///< its learning rate over the default
  std::uint64_t seed = 0;
  std::string tag;
  std::map<std::string, std::string> summary;
  long peak_rss_kib = 0;
  bool refused = false;  ///< not started: it needs more memory than is available
  double needed_bytes = std::nan("");  ///< its computed peak (on the CPU)

  double number(const std::string& key) const {
    const auto it = summary.find(key);
    return it == summary.end() ? std::nan("") : std::stod(it->second);
  }
};

inline std::string fixed(double v, int precision) {
  if (std::isnan(v)) return "-";
  std::ostringstream o;
  o << std::fixed << std::setprecision(precision) << v;
  return o.str();
}

inline std::string megabytes(double bytes) { return fixed(bytes / 1e6, bytes < 1e7 ? 3 : 1); }

inline std::string lr_text(double lr) {
  std::ostringstream o;
  o << std::setprecision(3) << lr;
  return o.str();
}

/// Mean and sample standard deviation (NaN for fewer than two values).
struct Spread {
  double mean = std::nan(""), sd = std::nan("");
  std::size_t n = 0;
};
inline Spread spread(const std::vector<double>& x) {
  Spread s;
  s.n = x.size();
  if (x.empty()) return s;
  double sum = 0;
  for (double v : x) sum += v;
  s.mean = sum / static_cast<double>(x.size());
  if (x.size() > 1) {
    double ss = 0;
    for (double v : x) ss += (v - s.mean) * (v - s.mean);
    s.sd = std::sqrt(ss / static_cast<double>(x.size() - 1));
  }
  return s;
}

/// "mean ± sd", or the mean alone when there is no spread.
inline std::string spread_text(const Spread& p) {
  return fixed(p.mean, 3) + (std::isnan(p.sd) ? "" : " ± " + fixed(p.sd, 3));
}

/// The runs of one optimizer at one learning rate, over the seeds.
struct Row {
  std::string optimizer;
  double factor = 1.0;
  double lr = 0;
  bool tuned = false;  ///< the best of its lr sweep
  std::vector<const RunResult*> runs;

  Spread of(const std::string& key) const {
    std::vector<double> v;
    for (const RunResult* r : runs) v.push_back(r->number(key));
    return spread(v);
  }
  std::string label() const { return display_name(optimizer) + (tuned ? ", tuned" : ""); }
  /// label(), with the lr a tuned row was picked at
  std::string label_with_lr() const { return label() + (tuned ? " (lr " + lr_text(lr) + ")" : ""); }
  long peak_rss_kib() const {
    long m = 0;
    for (const RunResult* r : runs) m = std::max(m, r->peak_rss_kib);
    return m;
  }
};

inline Row row_of(const std::vector<RunResult>& results, const std::string& optimizer, double factor, double lr) {
  Row r{optimizer, factor, lr * factor, false, {}};
  for (const RunResult& x : results)
    if (x.optimizer == optimizer && x.factor == factor) r.runs.push_back(&x);
  return r;
}

/// The optimizers whose learning rate --tune sweeps.
inline bool tuned_baseline(const std::string& optimizer) { return optimizer == "adamw" || optimizer == "adafactor"; }

/// The rows of the table: each optimizer at the default lr, then each swept
/// baseline at its best lr (lowest mean validation perplexity).
inline std::vector<Row> table_rows(const Settings& s, const std::vector<RunResult>& results) {
  std::vector<Row> rows;
  for (const auto& o : s.optimizers) {
    Row r = row_of(results, o, 1.0, s.lr);
    if (!r.runs.empty()) rows.push_back(std::move(r));  // none: every run of it was refused
  }
  if (!s.tune) return rows;
  for (const auto& o : s.optimizers) {
    if (!tuned_baseline(o)) continue;
    Row best;
    for (double f : s.tune_factors) {
      Row r = row_of(results, o, f, s.lr);
      if (best.runs.empty() || r.of("val_ppl").mean < best.of("val_ppl").mean) best = r;
    }
    best.tuned = true;
    rows.push_back(best);
  }
  return rows;
}

inline std::string table(const Settings& s, const std::vector<Row>& rows) {
  double adamw_bytes = std::nan("");
  for (const Row& r : rows)
    if (r.optimizer == "adamw") adamw_bytes = r.of("state_bytes").mean;
  int width = 24;  // the first column: the longest label and a space
  for (const Row& r : rows) width = std::max(width, static_cast<int>(r.label().size()) + 1);
  std::ostringstream t;
  t << std::left << std::setw(width) << "optimizer" << std::right << std::setw(8) << "lr" << std::setw(11) << "state MB"
    << std::setw(9) << "vs AdamW" << std::setw(10) << "backbone" << std::setw(9) << "experts" << std::setw(8)
    << "router" << std::setw(10) << "peak RSS" << std::setw(9) << "tok/s" << std::setw(8) << "step ms"
    << std::setw(11) << "val ppl" << std::setw(8) << "± sd" << std::setw(9) << "balance" << std::setw(10)
    << "max load" << "\n"
    << std::string(static_cast<std::size_t>(120 + width), '-') << "\n";
  for (const Row& r : rows) {
    const double bytes = r.of("state_bytes").mean;
    auto tier = [&](const char* key) { return megabytes(r.of(key).mean); };  // "-" without one
    const Spread ppl = r.of("val_ppl");
    const double load = r.of("max_load").mean;
    t << std::left << std::setw(width) << r.label() << std::right << std::setw(8) << lr_text(r.lr) << std::setw(11)
      << megabytes(bytes) << std::setw(9)
      << (std::isnan(adamw_bytes) ? std::string("-") : fixed(100.0 * bytes / adamw_bytes, 1) + " %") << std::setw(10)
      << tier("state_backbone") << std::setw(9) << tier("state_experts") << std::setw(8) << tier("state_router")
      << std::setw(6) << fixed(static_cast<double>(r.peak_rss_kib()) / 1024.0, 0) << " MiB" << std::setw(9)
      << fixed(r.of("tokens_per_s").mean, 0) << std::setw(8) << fixed(r.of("optimizer_ms_per_step").mean, 1)
      << std::setw(11) << fixed(ppl.mean, 3) << std::setw(8) << fixed(ppl.sd, 3) << std::setw(9)
      << fixed(r.of("balance_loss").mean, 3) << std::setw(8) << (std::isnan(load) ? "-" : fixed(100.0 * load, 1))
      << (std::isnan(load) ? "  " : " %") << "\n";
  }
  const std::size_t seeds = rows.empty() ? 0 : rows.front().runs.size();
  t << "state: optimizer state bytes (MB = 10^6 B; AdamW's from its state tensors, the others from the library);\n"
    << "peak RSS: whole process (LibTorch included), the largest over the seeds; tok/s: training, evaluation "
       "excluded;\n"
    << "step ms: optimizer.step() alone (a step inside backward is part of backward, not of this);\n"
    << "val ppl: per byte, on " << s.final_windows << " held-out windows of "
    << s.model.context << ", mean over " << seeds << (seeds == 1 ? " seed" : " seeds")
    << " (± sd: their standard deviation);\n"
    << "balance: load-balancing loss (1 = uniform routing); max load: how far the busiest expert's share of the\n"
    << "routed tokens is above the uniform share 1/" << s.model.experts << " (held-out windows, the busiest MoE layer)"
    << (s.tune ? ";\ntuned: the lr of the sweep with the lowest mean val ppl (selected on the same held-out windows)."
               : ".")
    << "\n";
  return t.str();
}

/// The lr sweep of --tune: mean validation perplexity at each factor.
inline std::string sweep_table(const Settings& s, const std::vector<RunResult>& results) {
  std::ostringstream t;
  t << "lr sweep (val ppl, mean ± sd over the seeds; default lr " << lr_text(s.lr) << "):\n"
    << std::left << std::setw(24) << "optimizer" << std::right;
  for (double f : s.tune_factors) t << std::setw(18) << ("x" + lr_text(f) + " (" + lr_text(s.lr * f) + ")");
  t << "\n";
  for (const auto& o : s.optimizers) {
    if (!tuned_baseline(o)) continue;
    t << std::left << std::setw(24) << display_name(o) << std::right;
    for (double f : s.tune_factors) {
      t << std::setw(18) << spread_text(row_of(results, o, f, s.lr).of("val_ppl"));
    }
    t << "\n";
  }
  return t.str();
}

/// How SkewAdam's perplexity compares with another row's, judged by the
/// seeds' spread: a gap larger than the larger of the two standard
/// deviations counts; one seed gives no spread to judge by.
struct Comparison {
  double gap = 0;      ///< other - SkewAdam: positive when SkewAdam is lower
  double sd = 0;       ///< the larger standard deviation
  bool known = false;  ///< both have a spread
  bool lower() const { return known && gap > sd; }
  bool higher() const { return known && -gap > sd; }
  std::string text() const {
    std::ostringstream o;
    o << "SkewAdam " << (gap >= 0 ? "lower" : "higher") << " by " << fixed(std::fabs(gap), 3);
    if (!known) o << " (one seed: no spread to judge the gap by)";
    else if (sd > 0) o << " (" << fixed(std::fabs(gap) / sd, 1) << " sd)";
    return o.str();
  }
};
inline Comparison compare(const Row& skew, const Row& other) {
  const Spread x = skew.of("val_ppl"), y = other.of("val_ppl");
  Comparison c;
  c.gap = y.mean - x.mean;
  c.known = !std::isnan(x.sd) && !std::isnan(y.sd);
  c.sd = c.known ? std::max(x.sd, y.sd) : 0;
  return c;
}

/// What the run shows of the paper's two claims, from its own figures: tiers
/// buy memory (SkewAdam's state against AdamW's), and momentum buys
/// perplexity (SkewAdam, with momentum on the backbone only, against AdamW
/// and Adafactor-like, tuned when swept, and against the uniform ablation,
/// which adds momentum on the experts). Says plainly where the run does not
/// support a half.
inline std::string claims(const std::vector<Row>& rows) {
  auto find = [&](const std::string& o, bool tuned) -> const Row* {
    for (const Row& r : rows)
      if (r.optimizer == o && r.tuned == tuned) return &r;
    return nullptr;
  };
  const Row* skew = find("skewadam", false);
  if (skew == nullptr) return "";
  std::ostringstream o;
  const double skew_bytes = skew->of("state_bytes").mean;
  bool memory = false;
  if (const Row* adamw = find("adamw", false)) {
    const double ratio = skew_bytes / adamw->of("state_bytes").mean;
    memory = ratio <= 0.05;
    o << "Tiers buy memory: SkewAdam keeps " << fixed(100.0 * ratio, 1) << " % of AdamW's optimizer state ("
      << megabytes(skew_bytes) << " of " << megabytes(adamw->of("state_bytes").mean) << " MB; the paper: 2.5 %)";
    if (const Row* uni = find("uniform", false))
      o << " and " << fixed(100.0 * skew_bytes / uni->of("state_bytes").mean, 1)
        << " % of the uniform ablation's (momentum on the experts too)";
    o << (memory ? "." : "; more than 5 %: this model's backbone is a larger share of it than the paper's.") << "\n";
  }
  o << "Momentum buys perplexity: SkewAdam " << spread_text(skew->of("val_ppl")) << " over " << skew->runs.size()
    << (skew->runs.size() == 1 ? " seed" : " seeds") << "\n";
  std::vector<std::string> behind, level, unjudged;
  for (const std::string& base : {std::string("adamw"), std::string("adafactor")}) {
    const Row* b = find(base, true);
    if (b == nullptr) b = find(base, false);
    if (b == nullptr) continue;
    const Comparison c = compare(*skew, *b);
    const std::string name = b->label_with_lr();
    o << "  against " << name << ", " << spread_text(b->of("val_ppl")) << ": " << c.text() << "\n";
    if (!c.known) unjudged.push_back(name);
    else if (!c.lower()) (c.higher() ? behind : level).push_back(name);
  }
  if (const Row* uni = find("uniform", false)) {
    const Comparison c = compare(*skew, *uni);
    o << "  against the uniform ablation (momentum on the experts too, "
      << fixed(uni->of("state_bytes").mean / skew_bytes, 1) << "x SkewAdam's state), " << spread_text(uni->of("val_ppl")) << ": "
      << c.text()
      << (c.known && !c.lower() && !c.higher() ? ": the experts' momentum buys nothing here, as in the paper" : "")
      << "\n";
  }
  auto list = [](const std::vector<std::string>& v) {
    std::string s;
    for (std::size_t i = 0; i < v.size(); ++i) s += (i ? (i + 1 == v.size() ? " and " : ", ") : "") + v[i];
    return s;
  };
  const bool perplexity = behind.empty() && level.empty() && unjudged.empty();
  if (memory && perplexity) {
    o << "This run supports both halves of the claim.\n";
    return o.str();
  }
  o << "This run " << (memory ? "supports the memory half" : "does not reach the paper's memory share");
  if (perplexity) {
    o << "; it supports the perplexity half.\n";
    return o.str();
  }
  std::vector<std::string> why;
  if (!behind.empty())
    why.push_back("SkewAdam's perplexity is higher than that of " + list(behind) + " by more than one standard deviation");
  if (!level.empty()) why.push_back("SkewAdam's perplexity is within one standard deviation of that of " + list(level));
  if (!unjudged.empty()) why.push_back("one seed leaves the gap to " + list(unjudged) + " unjudged (--seeds 3 or more)");
  o << "; it does not support the perplexity half: ";
  for (std::size_t i = 0; i < why.size(); ++i) o << (i ? "; " : "") << why[i];
  o << ".\n";
  return o.str();
}

/// The backbone's momentum stored in bf16 or 8 bits against fp32 (rows
/// skewadam-bf16, skewadam-8bit, skewadam-linear8bit and skewadam, each alone or all stepping
/// inside backward): their state and validation perplexity, and whether the
/// gap is within one standard deviation of the seeds (the larger of the
/// two). Empty when the run has no such pair.
inline std::string momentum_storage_claim(const std::vector<Row>& rows) {
  std::ostringstream o;
  for (const std::string& suffix : {std::string(), std::string(in_backward_suffix)}) {
    const Row* fp32 = nullptr;
    for (const Row& r : rows)
      if (r.optimizer == "skewadam" + suffix && !r.tuned) fp32 = &r;
    if (fp32 == nullptr) continue;
    for (const std::string& low :
         {std::string("skewadam-bf16"), std::string("skewadam-8bit"), std::string("skewadam-linear8bit")}) {
      const Row* other = nullptr;
      for (const Row& r : rows)
        if (r.optimizer == low + suffix && !r.tuned) other = &r;
      if (other == nullptr) continue;
      const Spread a = fp32->of("val_ppl"), b = other->of("val_ppl");
      const double gap = b.mean - a.mean;
      o << other->label() << ": " << spread_text(b) << ", state " << megabytes(other->of("state_bytes").mean)
        << " MB, against fp32 momentum " << spread_text(a) << ", " << megabytes(fp32->of("state_bytes").mean)
        << " MB: " << (gap >= 0 ? "higher" : "lower") << " by " << fixed(std::fabs(gap), 3);
      if (std::isnan(a.sd) || std::isnan(b.sd)) {
        o << " (one seed: no spread to judge the gap by)\n";
      } else {
        const double sd = std::max(a.sd, b.sd);
        o << (std::fabs(gap) <= sd ? ", within" : ", more than") << " one sd (" << fixed(sd, 3) << ")\n";
      }
    }
  }
  return o.str();
}

/// curves_mean.csv (each row's validation perplexity over the steps, mean
/// and sd over its seeds; row i alone in curve_mean_i.csv) and val_ppl.png
/// from them with gnuplot, the spread shaded.
inline void write_curves_and_plot(const Settings& s, const std::vector<Row>& rows) {
  namespace fs = std::filesystem;
  const fs::path dir = fs::absolute(s.out);
  std::ofstream mean(dir / "curves_mean.csv");
  mean << "row,step,val_ppl_mean,val_ppl_sd,low,high\n";
  for (std::size_t i = 0; i < rows.size(); ++i) {
    std::map<std::int64_t, std::vector<double>> at;  // step -> per seed
    for (const RunResult* r : rows[i].runs) {
      std::ifstream in(dir / ("curve_" + r->tag + ".csv"));
      std::string line;
      std::getline(in, line);
      while (std::getline(in, line)) {
        std::vector<std::string> f;
        std::stringstream ss(line);
        std::string x;
        while (std::getline(ss, x, ',')) f.push_back(x);
        if (f.size() >= 8) at[std::stoll(f[4])].push_back(std::stod(f[7]));
      }
    }
    std::ofstream one(dir / ("curve_mean_" + std::to_string(i) + ".csv"));  // this row's alone, for the plot
    for (const auto& [step, v] : at) {
      const Spread p = spread(v);
      const double sd = std::isnan(p.sd) ? 0.0 : p.sd;
      std::ostringstream line;
      line << step << "," << p.mean << "," << sd << "," << p.mean - sd << "," << p.mean + sd << "\n";
      mean << i << "," << line.str();
      one << line.str();
    }
  }
  mean.close();
  std::ofstream gp(dir / "val_ppl.gp");
  const std::size_t seeds = rows.empty() ? 0 : rows.front().runs.size();
  gp << "set terminal pngcairo size 960,600 font 'sans,11'\n"
     << "set output '" << (dir / "val_ppl.png").string() << "'\n"
     << "set datafile separator ','\n"
     << "set title 'MoE LM: validation perplexity (" << s.steps << " steps; mean of " << seeds
     << (seeds == 1 ? " seed" : " seeds, shaded: ± one standard deviation") << ")'\n"
     << "set xlabel 'step'\nset ylabel 'validation perplexity (per byte)'\nset grid\nset key top right\n"
     << "set style fill transparent solid 0.2 noborder\n"
     << "set logscale y\n"
     << "plot ";
  const std::map<std::string, std::string> colour{{"skewadam", "#d62728"},        {"adamw", "#1f77b4"},
                                                  {"skewadam-bf16", "#e377c2"},   {"skewadam-8bit", "#17becf"},
                                                  {"skewadam-linear8bit", "#bcbd22"},
                                                  {"adafactor", "#2ca02c"},       {"uniform", "#ff7f0e"},
                                                  {"expert-momentum", "#9467bd"}, {"factored-router", "#8c564b"},
                                                  {"no-optimizer", "#7f7f7f"}};
  for (std::size_t i = 0; i < rows.size(); ++i) {
    const std::string file = "'" + (dir / ("curve_mean_" + std::to_string(i) + ".csv")).string() + "'";
    const std::string lc = " lc rgb '" + colour.at(rule_of(rows[i].optimizer)) + "'" +
                           (in_backward(rows[i].optimizer) && rows[i].optimizer != "no-optimizer" ? " dt 3" : "");
    if (seeds > 1) gp << (i ? ", " : "") << file << " using 1:4:5 with filledcurves" << lc << " notitle";
    gp << (i || seeds > 1 ? ", " : "") << file << " using 1:2 with lines lw 2" << lc
       << (rows[i].tuned ? " dt 2" : "") << " title '" << rows[i].label_with_lr() << "'";
  }
  gp << "\n";
  gp.close();
  const std::string command = "gnuplot '" + (dir / "val_ppl.gp").string() + "' 2>/dev/null";
  if (std::system(command.c_str()) == 0) std::cout << "plot:    " << (dir / "val_ppl.png").string() << "\n";
  else std::cout << "plot:    gnuplot not found; install gnuplot-nox, then run: gnuplot " << (dir / "val_ppl.gp").string() << "\n";
}

/// results.csv: one line per run.
inline void write_results(const Settings& s, const std::vector<RunResult>& results) {
  std::ofstream csv(std::filesystem::path(s.out) / "results.csv");
  const char* keys[] = {"state_bytes", "state_backbone", "state_experts", "state_router", "tokens_per_s",
                        "seconds_per_step", "optimizer_ms_per_step", "val_loss", "val_ppl", "balance_loss",
                        "max_load", "train_seconds"};
  csv << "run,optimizer,lr,seed,peak_rss_kib,peak_bytes,needed_bytes";
  for (const char* k : keys) csv << "," << k;
  csv << "\n";
  for (const RunResult& r : results) {
    csv << r.tag << "," << r.optimizer << "," << s.lr * r.factor << "," << r.seed << ",";
    if (!r.refused) csv << r.peak_rss_kib << "," << static_cast<std::int64_t>(r.peak_rss_kib) * 1024;
    else csv << ",";
    csv << ",";
    if (!std::isnan(r.needed_bytes)) csv << std::llround(r.needed_bytes);
    for (const char* k : keys) {
      const auto it = r.summary.find(k);
      csv << "," << (it == r.summary.end() ? "" : it->second);
    }
    csv << "\n";
  }
}

}  // namespace moe_lm
