// skewadam-replay CASE_DIR [--out DIR] [--threads N] [--backend cpu|cuda|cuda-emulated]
//                 [--stop-after K] [--save FILE] [--load FILE] [--resume-at K]
// skewadam-replay --list-archs
//
// The CPU kernels are those of the widest architecture compiled in and
// supported here; SKEWADAM_CPU_ARCH=NAME runs another (--list-archs prints
// the names, engine/backend/cpu/arch.hpp). A level this program or processor cannot
// run exits 77 (skipped).
//
// --backend cuda runs the case on the GPU (a build with SKEWADAM_WITH_CUDA);
// it exits 77 when there is no CUDA device (ctest's code for a skipped test).
// --backend cuda-emulated runs it on the optimizer front-end over the CUDA
// backend, its kernels on the host (the emulated runtime,
// skewadam_tools/emulated_runtime.hpp); the checkpoint flags work as on the
// CPU, and its checkpoints load on either backend.
//
// Runs one golden conformance case exactly as the golden README says, prints
// the worst error of each array as a fraction of its tolerance, and exits 0
// only if every array is within tolerance (1: out of tolerance, 2: bad input,
// including an unreadable, corrupt or foreign checkpoint).
//
// Checkpoints (include/skewadam/checkpoint.hpp):
//   --stop-after K   run steps 1..K only, and check those
//   --save FILE      after the last step run, save the parameter and the
//                    optimizer state to FILE
//   --load FILE      start from FILE (saved by --save for this case) and run
//                    the remaining steps
//   --resume-at K    run steps 1..K, save to a temporary file, load it into a
//                    fresh optimizer and parameter, run steps K+1..N: the
//                    outputs must be those of an uninterrupted run, bit for bit
// --out writes what this run computed: params.npy holds the steps it ran
// (all N unless --stop-after or --load), the state files the state after the
// last of them.
//
// Sharded (built with SKEWADAM_WITH_MPI), under mpirun -np N:
//   --shard          run the case sharded over MPI_COMM_WORLD (the sharded
//                    placement, dist/sharded_optimizer.hpp; with --backend
//                    cuda-emulated, engine/placement/sharded.hpp over the
//                    emulated CUDA backend); rank 0 reports and writes
//                    --out; --stop-after, --save and --load work as above
//                    (checkpoints saved with any rank count load with any)
//   --expert-rows    shard a bank [E, r, c] by rows instead of whole experts

#include <CLI/CLI.hpp>

#include <cstdio>
#include <exception>
#include <string>

#include <skewadam_tools/cpu_arch_env.hpp>

#include "replay.hpp"

int main(int argc, char** argv) {
  using namespace skewadam;
  using namespace skewadam::replay_tool;
  CLI::App app{"Run a SkewAdam golden conformance case and compare with its expected outputs"};
  Options o;
  app.add_option("case", o.case_dir, "case folder (case.json, param0.npy, grads.npy, ...)")->required();
  app.add_option("--out", o.out_dir, "write the computed params.npy and state files here, golden layout");
  app.add_option("--threads", o.threads, "CPU threads (0: hardware)")->check(CLI::NonNegativeNumber);
#if defined(SKEWADAM_REPLAY_WITH_CUDA_EMULATED)
  app.add_option("--backend", o.backend,
                 "cpu; cuda: run the case on the GPU; cuda-emulated: the CUDA backend's kernels on the host")
      ->check(CLI::IsMember({"cpu", "cuda", "cuda-emulated"}));
#else  // (a build without the emulated backend, SKEWADAM_REPLAY_CUDA_EMULATED=OFF, does not offer it)
  app.add_option("--backend", o.backend, "cpu; cuda: run the case on the GPU")
      ->check(CLI::IsMember({"cpu", "cuda"}));
#endif
  auto* stop = app.add_option("--stop-after", o.stop_after, "run steps 1..K only");
  auto* save = app.add_option("--save", o.save, "after the last step run, save the parameter and optimizer state");
  auto* load = app.add_option("--load", o.load, "start from a checkpoint saved by --save for this case");
  auto* resume = app.add_option("--resume-at", o.resume_at,
                                "run steps 1..K, save, load into a fresh optimizer, run the rest");
  resume->excludes(stop)->excludes(save)->excludes(load);
  auto* shard = app.add_flag("--shard", o.shard, "run sharded over the MPI ranks (under mpirun)");
  app.add_flag("--expert-rows", o.expert_rows, "with --shard: shard an expert bank by rows, not by experts")
      ->needs(shard);
  shard->excludes(resume);
  app.add_flag_callback(
         "--list-archs",
         [] {
           for (const auto a : backend::cpu::available_archs()) std::printf("%s\n", backend::cpu::level_name(a));
           throw CLI::Success();
         },
         "print the CPU kernel architectures this program can run here, widest first, and exit "
         "(SKEWADAM_CPU_ARCH=NAME selects one)")
      ->trigger_on_parse();
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    const int rc = app.exit(e);
    return rc == 0 ? 0 : 2;
  }
  if (const auto why = requested_arch_unavailable(); why && o.backend == "cpu") {
    std::printf("skipped: %s\n", why->c_str());
    return 77;
  }
  try {
    const GoldenCase c = load_golden_case(o.case_dir);
    if (o.backend == "cuda") return replay_cuda(c, o);
    if (o.backend == "cuda-emulated") {
#if defined(SKEWADAM_REPLAY_WITH_CUDA_EMULATED)
      return replay_cuda_emulated(c, o);
#else
      throw CaseError("--backend cuda-emulated: this skewadam-replay was built without it "
                      "(SKEWADAM_REPLAY_CUDA_EMULATED=OFF)");
#endif
    }
    return replay_cpu(c, o);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "skewadam-replay: %s\n", e.what());
    return 2;
  }
}
