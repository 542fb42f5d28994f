// tools/common/skewadam_tools/cuda_runner.hpp on the optimizer front-end over
// the CUDA backend (skewadam/cuda.cuh).

#include <skewadam_tools/cuda_runner.hpp>

#include <cuda_runtime.h>

#include <cstdio>
#include <cstring>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include <skewadam/backend/cuda/device_buffer.cuh>
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

template <class T, class G>
RunResult run_typed(const RunSpec& spec) {
  const Shape shape(spec.shape.begin(), static_cast<index_t>(spec.shape.size()), "shape");
  const index_t n = shape.numel();
  const auto bytes = static_cast<std::size_t>(n) * sizeof(T);
  const auto grad_bytes = static_cast<std::size_t>(n) * sizeof(G);
  if (spec.lr.size() != static_cast<std::size_t>(spec.steps))
    throw std::invalid_argument("lr: " + std::to_string(spec.lr.size()) + " values for " + std::to_string(spec.steps) +
                                " steps");
  RunResult out;
  out.params.resize(bytes * static_cast<std::size_t>(spec.steps));
  Stream stream;
  DeviceBuffer<std::uint8_t> p(bytes), g(grad_bytes);
  DeviceBuffer<double> lr(3);
  check(cudaMemcpy(p.data(), spec.param0, bytes, cudaMemcpyHostToDevice), "cudaMemcpy (param0)");

  auto go = [&]<class Rule>() {
    skewadam::cuda::Optimizer<TierRules<Rule, Rule, Rule>> opt(spec.hyper, {.seed = spec.seed, .stream = stream.s});
    const ParamId id = opt.add(spec.name, Tier::backbone, TensorView<T>(reinterpret_cast<T*>(p.data()), shape),
                               TensorView<const G>(reinterpret_cast<const G*>(g.data()), shape));
    std::optional<typename decltype(opt)::StepGraph> graph;
    if (spec.graph) opt.set_lr_device(lr.data());
    for (std::int64_t t = 0; t < spec.steps; ++t) {
      const auto* src = static_cast<const std::uint8_t*>(spec.grads) + static_cast<std::size_t>(t) * grad_bytes;
      check(cudaMemcpyAsync(g.data(), src, grad_bytes, cudaMemcpyHostToDevice, stream.s), "cudaMemcpyAsync (grad)");
      const double l = spec.lr[static_cast<std::size_t>(t)];
      if (spec.graph) {
        const double three[3] = {l, l, l};
        check(cudaMemcpyAsync(lr.data(), three, sizeof three, cudaMemcpyHostToDevice, stream.s), "cudaMemcpyAsync (lr)");
        check(cudaStreamSynchronize(stream.s), "cudaStreamSynchronize");
        if (t == 0) {
          opt.step();  // an ordinary step first; later steps replay a capture
        } else {
          if (!graph) graph.emplace(opt.capture_step());
          opt.replay(*graph);
        }
      } else {
        opt.set_lr(l);
        opt.step();
      }
      check(cudaMemcpyAsync(out.params.data() + static_cast<std::size_t>(t) * bytes, p.data(), bytes,
                            cudaMemcpyDeviceToHost, stream.s),
            "cudaMemcpyAsync (param)");
      check(cudaStreamSynchronize(stream.s), "cudaStreamSynchronize");
    }
    out.state = opt.export_state().params[static_cast<std::size_t>(id.index)].state;
  };
  auto rounded = [&]<class Rule>() {
    if (spec.nearest) go.template operator()<typename Rule::template with_rounding<NearestRounding>>();
    else go.template operator()<Rule>();
  };
  switch (spec.rule) {
    case RuleKind::backbone: rounded.template operator()<BackboneRule>(); break;
    case RuleKind::experts: rounded.template operator()<ExpertRule>(); break;
    case RuleKind::router: rounded.template operator()<RouterRule>(); break;
    case RuleKind::exact_momentum: rounded.template operator()<ExactMomentumRule>(); break;
    case RuleKind::adamw: rounded.template operator()<AdamWRule>(); break;
  }
  return out;
}

template <class T>
__global__ void round_kernel(const float* x, std::uint16_t* out, index_t n, RoundingKey key) {
  const index_t i = static_cast<index_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < n) out[i] = bits_of(StochasticRounding::store<T>(x[i], random_bits(key, i)));
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
  const Dtype grad = spec.grad_dtype.value_or(spec.dtype);
  if (grad != spec.dtype && grad != Dtype::f32)
    throw std::invalid_argument("grad_dtype: must be f32 or the parameter's dtype");
  const bool f32_grads = grad == Dtype::f32;
  switch (spec.dtype) {
    case Dtype::f32: return run_typed<float, float>(spec);
    case Dtype::bf16: return f32_grads ? run_typed<bf16, float>(spec) : run_typed<bf16, bf16>(spec);
    case Dtype::f16: return f32_grads ? run_typed<f16, float>(spec) : run_typed<f16, f16>(spec);
  }
  throw std::invalid_argument("dtype: unknown");
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
