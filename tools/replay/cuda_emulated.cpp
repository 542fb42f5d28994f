// skewadam-replay --backend cuda-emulated: the case on the CUDA backend, its kernels
// run on the host by the emulated runtime.

#include <skewadam_tools/emulated_runtime.hpp>
#include "replay.hpp"

namespace skewadam::replay_tool {

int replay_cuda_emulated(const GoldenCase& c, const Options& o) {
  return with_case_rule(c, [&]<class Rule>() { return replay<Rule, EmulatedCuda>(c, o); });
}

}  // namespace skewadam::replay_tool
