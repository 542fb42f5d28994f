#pragma once
// Where moe_lm runs: the device a --device name means, waiting for it, and
// its memory as torch's CUDA caching allocator and nvidia-smi see it.
//
// The CUDA parts are compiled when the demo is built against a CUDA build of
// LibTorch (CMakeLists.txt defines MOE_LM_WITH_CUDA=1 and adds
// cuda_engines.cu, which registers the library's CUDA engines). A CPU-only
// LibTorch builds the rest unchanged and refuses --device cuda.

#include <torch/cuda.h>
#include <torch/torch.h>

#if MOE_LM_WITH_CUDA
#include <c10/cuda/CUDACachingAllocator.h>
#endif

#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <sstream>
#include <stdexcept>
#include <string>

namespace moe_lm {

inline torch::Device resolve_device(const std::string& name) {
  if (name == "cpu") return torch::kCPU;
  if (name != "cuda") throw std::invalid_argument("--device " + name + ": expected cpu or cuda");
#if MOE_LM_WITH_CUDA
  if (!torch::cuda::is_available()) throw std::runtime_error("--device cuda: no CUDA device is visible to this process");
  return {torch::kCUDA, 0};
#else
  throw std::runtime_error(
      "--device cuda: this build links a CPU-only LibTorch (Debian's libtorch-dev). Build the demo against a "
      "CUDA LibTorch: scripts/demo --device cuda uses the installed Python torch's when it has CUDA");
#endif
}

/// Waits until the device has done all the work queued so far (timing).
inline void synchronize(const torch::Device& d) {
  if (d.is_cuda()) torch::cuda::synchronize(d.index());
}

/// torch's CUDA caching allocator: bytes in tensors now and at the peak since
/// the last reset_peak(); -1 on the CPU. Memory the library allocates itself
/// (its device state) is not in these counters.
struct AllocatorBytes {
  std::int64_t allocated = -1;
  std::int64_t peak_allocated = -1;
  std::int64_t peak_reserved = -1;
};

inline void reset_peak([[maybe_unused]] const torch::Device& d) {
#if MOE_LM_WITH_CUDA
  if (d.is_cuda()) c10::cuda::CUDACachingAllocator::resetPeakStats(d.index());
#endif
}

inline AllocatorBytes allocator_bytes([[maybe_unused]] const torch::Device& d) {
  AllocatorBytes b;
#if MOE_LM_WITH_CUDA
  if (d.is_cuda()) {
    const auto stats = c10::cuda::CUDACachingAllocator::getDeviceStats(d.index());
    b.allocated = stats.allocated_bytes[0].current;  // [0]: every pool together
    b.peak_allocated = stats.allocated_bytes[0].peak;
    b.peak_reserved = stats.reserved_bytes[0].peak;
  }
#endif
  return b;
}

/// nvidia-smi's memory in use, in MiB: this process's when nvidia-smi lists
/// it, else the whole GPU's (a container may hide process ids); -1 without
/// nvidia-smi. `what` says which.
struct SmiMemory {
  long mib = -1;
  std::string what = "n/a";
};

inline SmiMemory nvidia_smi_memory() {
  SmiMemory m;
  auto read = [](const char* command) {
    std::string text;
    if (FILE* p = popen(command, "r")) {
      char buf[512];
      while (fgets(buf, sizeof buf, p)) text += buf;
      pclose(p);
    }
    return text;
  };
  std::istringstream apps(read("nvidia-smi --query-compute-apps=pid,used_memory --format=csv,noheader,nounits 2>/dev/null"));
  std::string line;
  while (std::getline(apps, line)) {
    long pid = 0, mib = 0;
    if (std::sscanf(line.c_str(), "%ld, %ld", &pid, &mib) == 2 && pid == static_cast<long>(getpid()))
      return {mib, "this process"};
  }
  std::istringstream gpu(read("nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits -i 0 2>/dev/null"));
  long mib = 0;
  if (gpu >> mib) return {mib, "whole GPU"};
  return m;
}

}  // namespace moe_lm
