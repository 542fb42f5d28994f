// The uniform ablation and the baselines: Adafactor-like and AdamW.

#include "engine.hpp"

namespace skewadam::python {

void bind_baselines(py::module_& m) {
  bind_engine<UniformTiers>(m, "UniformAblationEngine");
  bind_engine<AdafactorTiers>(m, "AdafactorLikeEngine");
  bind_engine<AdamWTiers>(m, "AdamWEngine");
}

}  // namespace skewadam::python
