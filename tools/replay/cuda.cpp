// skewadam-replay --backend cuda: the case on the GPU (a build with
// SKEWADAM_WITH_CUDA).

#include "replay.hpp"

#if defined(SKEWADAM_REPLAY_WITH_CUDA)
#include <skewadam_tools/cuda_golden.hpp>
#endif

namespace skewadam::replay_tool {

/// The whole case on the GPU (--backend cuda).
int replay_cuda(const GoldenCase& c, const Options& o) {
  if (o.resume_at || o.stop_after || !o.save.empty() || !o.load.empty())
    throw CaseError("--backend cuda: --stop-after, --save, --load and --resume-at are CPU-only");
  if (o.shard)
    throw CaseError("--backend cuda: --shard runs on the CPU or cuda-emulated backend here (on a GPU, the sharded "
                    "engine is tested by skewadam-sharded-gpu-tests)");
#if defined(SKEWADAM_REPLAY_WITH_CUDA)
  if (cuda::device_count() == 0) {
    std::printf("SKIP: --backend cuda: no CUDA device\n");
    return 77;
  }
  const CaseRun run = run_golden_case_cuda(c);
  const auto checks = check_steps(c, run, 0, c.steps);
  std::printf("%s: %lld steps on %s\n", c.name.c_str(), static_cast<long long>(c.steps),
              cuda::device_description().c_str());
  return report(c, checks, run, 0, c.steps, o.out_dir);
#else
  (void)c;
  throw CaseError("--backend cuda: this skewadam-replay was built without CUDA (SKEWADAM_WITH_CUDA=OFF)");
#endif
}

}  // namespace skewadam::replay_tool
