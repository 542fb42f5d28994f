// SkewAdam, with its backbone momentum in fp32, bf16 or 8 bits, and the
// paper's ablations of it.

#include "engine.hpp"

namespace skewadam::python {

void bind_paper_variants(py::module_& m) {
  bind_engine<SkewAdamTiers>(m, "SkewAdamEngine");
  bind_engine<SkewAdamBf16Tiers>(m, "SkewAdamBf16MomentumEngine");
  bind_engine<SkewAdam8bitTiers>(m, "SkewAdam8bitEngine");
  bind_engine<ExpertMomentumTiers>(m, "ExpertMomentumAblationEngine");
  bind_engine<FactoredRouterTiers>(m, "FactoredRouterAblationEngine");
  bind_engine<ExactExpertsTiers>(m, "ExactExpertsAblationEngine");
}

}  // namespace skewadam::python
