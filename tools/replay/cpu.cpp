// skewadam-replay --backend cpu: the case on the CPU backend, at the kernel level
// SKEWADAM_CPU_ARCH selects (or the widest this processor runs).

#include "replay.hpp"

namespace skewadam::replay_tool {

int replay_cpu(const GoldenCase& c, const Options& o) {
  return with_case_rule(c, [&]<class Rule>() { return replay<Rule, backend::DefaultBackend>(c, o); });
}

}  // namespace skewadam::replay_tool
