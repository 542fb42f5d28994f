// tools/common/skewadam_tools/cuda_runner.hpp on the optimizer front-end over
// the CUDA backend (skewadam/cuda.cuh). Every copy of a run is ordered on the
// optimizer's own (non-blocking) stream (cuda_steps.hpp); the rounding check
// runs on the legacy stream, whose copies order its kernel.

#include <skewadam_tools/cuda_runner.hpp>
#include <skewadam_tools/cuda_steps.hpp>

#include <cuda_runtime.h>

#include <cstdio>
#include <cstring>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include <skewadam/engine/backend/cuda/device_buffer.cuh>
#include <skewadam/cuda.cuh>

namespace skewadam::tools::cuda {

namespace {

using backend::cuda::check;
using backend::cuda::DeviceBuffer;

/// A CUDA stream that destroys itself.
struct Stream {
  cudaStream_t s = nullptr;
  Stream() { check(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), "cudaStreamCreate"); }
  ~Stream() { (void)cudaStreamDestroy(s); }
  Stream(const Stream&) = delete;
  Stream& operator=(const Stream&) = delete;
};

template <class T>
__global__ void round_kernel(const float* x, std::uint16_t* out, index_t n, RoundingKey key) {
  const index_t i = static_cast<index_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < n) out[i] = bits_of(StochasticRounding::store<T>(x[i], random_bits(key, i)));
}

__global__ void step_scalars_kernel(Hyperparameters h, const std::int64_t* steps, StepScalars* out, index_t n) {
  const index_t i = static_cast<index_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < n) out[i] = make_step_scalars(h, steps[i], 1.0);
}

}  // namespace

int device_count() noexcept { return backend::cuda::device_count(); }

std::string device_description() {
  cudaDeviceProp p{};
  check(cudaGetDeviceProperties(&p, 0), "cudaGetDeviceProperties");
  char buf[256];
  std::snprintf(buf, sizeof buf, "%s, %d SMs, %.1f GiB, sm_%d%d", p.name, p.multiProcessorCount,
                static_cast<double>(p.totalGlobalMem) / (1024.0 * 1024.0 * 1024.0), p.major, p.minor);
  return buf;
}

RunResult run(const RunSpec& spec) {
  Stream stream;
  return run_steps<backend::cuda::DeviceRuntime>(spec, stream.s);
}

std::vector<std::uint16_t> stochastic_round(const std::vector<float>& x, Dtype dtype, RoundingKey key) {
  const auto n = static_cast<index_t>(x.size());
  DeviceBuffer<float> dx(x.size());
  DeviceBuffer<std::uint16_t> dy(x.size());
  std::vector<std::uint16_t> y(x.size());
  if (n == 0) return y;
  check(cudaMemcpy(dx.data(), x.data(), x.size() * sizeof(float), cudaMemcpyHostToDevice), "cudaMemcpy");
  const auto blocks = static_cast<unsigned>((n + 255) / 256);
  if (dtype == Dtype::bf16) round_kernel<bf16><<<blocks, 256>>>(dx.data(), dy.data(), n, key);
  else if (dtype == Dtype::f16) round_kernel<f16><<<blocks, 256>>>(dx.data(), dy.data(), n, key);
  else throw std::invalid_argument("dtype: stochastic rounding is to bf16 or f16");
  check(cudaGetLastError(), "round_kernel launch");
  check(cudaMemcpy(y.data(), dy.data(), y.size() * sizeof(std::uint16_t), cudaMemcpyDeviceToHost), "cudaMemcpy");
  return y;
}

std::vector<StepScalars> device_step_scalars(const Hyperparameters& h, const std::vector<std::int64_t>& steps) {
  std::vector<StepScalars> out(steps.size());
  if (steps.empty()) return out;
  const auto n = static_cast<index_t>(steps.size());
  DeviceBuffer<std::int64_t> ds(steps.size());
  DeviceBuffer<StepScalars> dout(steps.size());
  check(cudaMemcpy(ds.data(), steps.data(), steps.size() * sizeof(std::int64_t), cudaMemcpyHostToDevice),
        "cudaMemcpy");
  step_scalars_kernel<<<static_cast<unsigned>((n + 255) / 256), 256>>>(h, ds.data(), dout.data(), n);
  check(cudaGetLastError(), "step_scalars_kernel launch");
  check(cudaMemcpy(out.data(), dout.data(), out.size() * sizeof(StepScalars), cudaMemcpyDeviceToHost), "cudaMemcpy");
  return out;
}

std::vector<std::string> bad_input_messages() {
  std::vector<std::string> out;
  std::vector<float> host(16);
  DeviceBuffer<float> dev(16);
  DeviceBuffer<bf16> dev16(16);
  skewadam::cuda::Optimizer<> opt;
  try {
    opt.add("w", Tier::experts, TensorView<float>(host.data(), {4, 4}));
    out.push_back("(no error for a host parameter pointer)");
  } catch (const std::invalid_argument& e) {
    out.push_back(e.what());
  }
  try {
    opt.add("w", Tier::experts, TensorView<float>(dev.data(), {4, 4}), TensorView<const bf16>(dev16.data(), {4, 4}));
    out.push_back("(no error for a bf16 gradient of an fp32 parameter)");
  } catch (const std::invalid_argument& e) {
    out.push_back(e.what());
  }
  if (opt.size() != 0) out.push_back("(a rejected parameter was registered)");
  return out;
}

}  // namespace skewadam::tools::cuda
