#pragma once
// moe_lm's memory accounting: the model's plan (parameters, weights and each
// optimizer's state, from names, shapes and dtypes alone: skewadam/plan.hpp)
// and, after a run on a GPU, its peak device memory by part beside the
// paper's figures.

#include <skewadam/plan.hpp>

#include <cmath>
#include <cstdint>
#include <iomanip>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "model.hpp"

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
inline double planned_state_bytes(const skewadam::Plan& plan, const std::string& optimizer) {
  const auto& s = plan.state_bytes;
  if (optimizer == "skewadam") return static_cast<double>(s.skewadam);
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

/// One run's memory, from its summary file (keys written by the worker).
struct RunMemory {
  std::string name;
  double weights = 0, grads = 0, state = 0;  ///< bytes
  double allocator_peak = -1;                ///< torch's caching allocator, peak allocated
  double library_device = 0;                 ///< the library's own device memory (its state)
  double smi_mib = -1;
  std::string smi_what;

  double peak() const { return allocator_peak < 0 ? -1 : allocator_peak + library_device; }
  double rest() const { return peak() < 0 ? -1 : peak() - weights - grads - state; }
};

/// The paper's peak training memory (GB = GiB) of its 6.78B model.
inline const std::map<std::string, double> paper_peak_gib{{"skewadam", 31.3}, {"adamw", 81.4}};

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
