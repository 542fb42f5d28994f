#pragma once
// moe_lm's memory accounting: the model's plan (parameters, weights and each
// optimizer's state, from names, shapes and dtypes alone: skewadam/plan.hpp)
// and, after a run on a GPU, its peak device memory by part beside the
// paper's figures.

#include <skewadam/plan.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <fstream>
#include <iomanip>
#include <limits>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "model.hpp"
#include "settings.hpp"

namespace moe_lm {

inline constexpr double gib = 1024.0 * 1024.0 * 1024.0;

/// The planner's view of a model's parameters.
inline skewadam::Plan plan_of(MoELMImpl& model) {
  std::vector<skewadam::TensorSpec> specs;
  for (const auto& p : model.named_parameters()) {
    const auto& t = p.value();
    skewadam::TensorSpec spec;
    spec.name = p.key();
    const auto sizes = t.sizes();
    spec.shape = sizes.empty() ? skewadam::Shape({1}) : skewadam::Shape(sizes.begin(), static_cast<skewadam::index_t>(sizes.size()), p.key());
    spec.dtype = t.scalar_type() == torch::kBFloat16 ? skewadam::Dtype::bf16
                 : t.scalar_type() == torch::kHalf   ? skewadam::Dtype::f16
                                                     : skewadam::Dtype::f32;
    specs.push_back(std::move(spec));
  }
  return skewadam::make_plan(specs);
}

/// The planned optimizer state of one of the demo's optimizers.
inline double planned_state_bytes(const skewadam::Plan& plan, const std::string& run_optimizer) {
  const std::string optimizer = rule_of(run_optimizer);
  if (optimizer == "no-optimizer") return 0.0;
  const auto& s = plan.state_bytes;
  if (optimizer == "skewadam") return static_cast<double>(s.skewadam);
  if (optimizer == "skewadam-bf16") return static_cast<double>(s.skewadam_bf16);
  if (optimizer == "skewadam-8bit" || optimizer == "skewadam-linear8bit") return static_cast<double>(s.skewadam_8bit);
  if (optimizer == "adamw") return static_cast<double>(s.adamw);
  if (optimizer == "adafactor") return static_cast<double>(s.adafactor);
  if (optimizer == "uniform") return static_cast<double>(s.uniform);
  if (optimizer == "expert-momentum") return static_cast<double>(s.expert_momentum);
  if (optimizer == "factored-router") return static_cast<double>(s.factored_router);
  return std::nan("");
}

inline std::string gib_text(double bytes, int precision = 2) {
  if (std::isnan(bytes) || bytes < 0) return "-";
  std::ostringstream o;
  o << std::fixed << std::setprecision(precision) << bytes / gib;
  return o.str();
}

/// Bytes as the paper writes them: GiB from 1 GiB up, MB (10^6 B) below.
inline std::string bytes_text(double bytes) {
  std::ostringstream o;
  o << std::fixed;
  if (bytes >= gib) o << std::setprecision(2) << bytes / gib << " GiB";
  else o << std::setprecision(bytes < 1e7 ? 3 : 1) << bytes / 1e6 << " MB";
  return o.str();
}

/// Parameters and planned memory, per tier and per optimizer.
inline std::string plan_text(const skewadam::Plan& p, const std::vector<std::string>& optimizers) {
  std::ostringstream o;
  const auto millions = [](skewadam::index_t n) {
    std::ostringstream m;
    m << std::fixed << std::setprecision(2) << static_cast<double>(n) / 1e6 << " M";
    return m.str();
  };
  o << "plan:    " << millions(p.total_params) << " parameters (backbone " << millions(p.tiers.backbone.params)
    << ", experts " << millions(p.tiers.experts.params) << " = " << std::fixed << std::setprecision(1)
    << 100.0 * static_cast<double>(p.tiers.experts.params) / static_cast<double>(p.total_params) << " %, router "
    << millions(p.tiers.router.params) << "); weights " << bytes_text(static_cast<double>(p.weights_bytes)) << "\n"
    << "         optimizer state:";
  for (std::size_t i = 0; i < optimizers.size(); ++i)
    o << (i ? ", " : " ") << optimizers[i] << " " << bytes_text(planned_state_bytes(p, optimizers[i]));
  o << "\n         SkewAdam's by tier: backbone " << bytes_text(static_cast<double>(p.tiers.backbone.state_bytes))
    << ", experts " << bytes_text(static_cast<double>(p.tiers.experts.state_bytes)) << ", router "
    << bytes_text(static_cast<double>(p.tiers.router.state_bytes)) << "\n";
  return o.str();
}

/// What a run on the CPU needs at its peak, computed before it starts from
/// the model's shapes: its weights, the gradients it holds at once (all of
/// them, or with the step inside backward the largest), the optimizer's state
/// and the rest (activations, the runtime's own memory), which is an
/// estimate until a run of this model has measured it.
struct MemoryNeed {
  double weights = 0, grads = 0, state = 0, rest = 0;  ///< bytes
  double total() const { return weights + grads + state + rest; }
};

inline MemoryNeed memory_need(MoELMImpl& model, const skewadam::Plan& plan, const std::string& optimizer,
                              double rest) {
  MemoryNeed n;
  n.weights = static_cast<double>(plan.weights_bytes);
  for (const auto& p : model.parameters()) {
    const double bytes = static_cast<double>(p.numel()) * static_cast<double>(p.element_size());
    n.grads = in_backward(optimizer) ? std::max(n.grads, bytes) : n.grads + bytes;
  }
  n.state = planned_state_bytes(plan, optimizer);
  n.rest = rest;
  return n;
}

/// The first estimate of the rest, before any run has measured it: 0.5 GiB
/// of runtime and a quarter of the weights for activations, above what the
/// paper preset measured (1.90 GiB without an optimizer, against 12.64 GiB of
/// weights), so that the first run is not started where it may not fit.
inline double first_rest_estimate(const skewadam::Plan& plan) {
  return 0.5 * gib + 0.25 * static_cast<double>(plan.weights_bytes);
}

/// The memory this process may still take: the smaller of the kernel's
/// MemAvailable and what the control group's limit leaves (cgroup v2).
inline double available_memory_bytes() {
  double available = std::numeric_limits<double>::infinity();
  {
    std::ifstream in("/proc/meminfo");
    std::string key;
    double kib = 0;
    std::string unit;
    while (in >> key >> kib >> unit)
      if (key == "MemAvailable:") available = kib * 1024.0;
  }
  std::ifstream max_file("/sys/fs/cgroup/memory.max"), current_file("/sys/fs/cgroup/memory.current");
  std::string max_text;
  double current = 0;
  if (max_file >> max_text && max_text != "max" && current_file >> current)
    available = std::min(available, std::stod(max_text) - current);
  return available;
}

/// One run's memory, from its summary file (keys written by the worker).
struct RunMemory {
  std::string name;
  double weights = 0, grads = 0, state = 0;  ///< bytes
  double allocator_peak = -1;                ///< torch's caching allocator, peak allocated
  double library_device = 0;                 ///< the library's own device memory (its state)
  double rss_peak = -1;                      ///< on the CPU: the process's peak resident memory
  double needed = -1;                        ///< on the CPU: the computed need (MemoryNeed::total)
  bool refused = false;                      ///< not started: it needs more than is available
  double smi_mib = -1;
  std::string smi_what;

  double peak() const {
    if (refused) return -1;
    if (rss_peak >= 0) return rss_peak;
    return allocator_peak < 0 ? -1 : allocator_peak + library_device;
  }
  double rest() const { return peak() < 0 ? -1 : peak() - weights - grads - state; }
};

/// The paper's peak training memory (GB = GiB) of its 6.78B model.
inline const std::map<std::string, double> paper_peak_gib{{"skewadam", 31.3}, {"adamw", 81.4}};

/// The CPU runs' memory: measured peak resident memory by part, the computed
/// need beside it, and the paper's figure.
inline std::string cpu_memory_table(const std::vector<RunMemory>& runs, double available) {
  int width = 32;  // the first column: the longest name and a space
  for (const auto& r : runs) width = std::max(width, static_cast<int>(display_name(r.name).size()) + 1);
  std::ostringstream o;
  o << std::left << std::setw(width) << "run" << std::right << std::setw(9) << "weights" << std::setw(8) << "grads"
    << std::setw(8) << "state" << std::setw(8) << "rest" << std::setw(9) << "peak" << std::setw(9) << "needed"
    << std::setw(8) << "paper" << "   (GiB)\n"
    << std::string(static_cast<std::size_t>(67 + width), '-') << "\n";
  double baseline = -1;
  for (const auto& r : runs)
    if (r.name == "no-optimizer") baseline = r.peak();
  for (const auto& r : runs) {
    const auto paper = paper_peak_gib.find(r.name);
    o << std::left << std::setw(width) << display_name(r.name) << std::right << std::setw(9) << gib_text(r.weights)
      << std::setw(8) << gib_text(r.grads) << std::setw(8) << gib_text(r.state) << std::setw(8)
      << gib_text(r.rest()) << std::setw(9) << (r.refused ? std::string("refused") : gib_text(r.peak()))
      << std::setw(9) << gib_text(r.needed) << std::setw(8)
      << (paper == paper_peak_gib.end() ? std::string("-") : gib_text(paper->second * gib, 1)) << "\n";
  }
  o << "peak: the run's peak resident memory (measured); needed: computed before it started (weights +\n"
       "      gradients held at once + state + the rest, measured by an earlier run of this model or estimated);\n"
       "      a run whose need exceeds the "
    << gib_text(available) << " GiB available is refused up front. rest: peak - weights - grads - state.\n";
  for (const auto& r : runs)
    if (baseline >= 0 && r.name != "no-optimizer" && r.peak() >= 0)
      o << display_name(r.name) << ": peak - the no-optimizer run's peak = " << gib_text(r.peak() - baseline, 3)
        << " GiB (its state: " << gib_text(r.state, 3) << " GiB)\n";
  o << "paper: peak training memory of this model on a GPU (SkewAdam 31.3 GB, AdamW 81.4 GB).\n";
  return o.str();
}

inline std::string memory_table(const std::vector<RunMemory>& runs) {
  std::ostringstream o;
  o << std::left << std::setw(18) << "optimizer" << std::right << std::setw(10) << "weights" << std::setw(8)
    << "grads" << std::setw(8) << "state" << std::setw(8) << "rest" << std::setw(8) << "peak" << std::setw(9)
    << "paper" << std::setw(18) << "nvidia-smi" << "   (GiB)\n"
    << std::string(95, '-') << "\n";
  for (const auto& r : runs) {
    const auto paper = paper_peak_gib.find(r.name);
    std::ostringstream smi;
    if (r.smi_mib >= 0) smi << std::fixed << std::setprecision(2) << r.smi_mib / 1024.0 << " (" << r.smi_what << ")";
    else smi << "-";
    o << std::left << std::setw(18) << r.name << std::right << std::setw(10) << gib_text(r.weights) << std::setw(8)
      << gib_text(r.grads) << std::setw(8) << gib_text(r.state) << std::setw(8) << gib_text(r.rest()) << std::setw(8)
      << gib_text(r.peak()) << std::setw(9)
      << (paper == paper_peak_gib.end() ? std::string("-") : gib_text(paper->second * gib, 1)) << std::setw(26)
      << smi.str() << "\n";
  }
  o << "peak: torch's CUDA caching allocator at its peak (weights, gradients, AdamW's state, activations)\n"
       "      plus the library's own device memory (SkewAdam's state); rest: peak - weights - gradients - state.\n"
       "paper: peak training memory of this model (SkewAdam 31.3 GB, AdamW 81.4 GB; it trains with SkewAdam\n"
       "      within a 40 GB accelerator).\n";
  return o.str();
}

}  // namespace moe_lm
