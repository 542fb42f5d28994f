// skewadam-cuda-bench: time of one optimizer step on the GPU per rule, shape
// and dtype (the CPU bench's tiers and shapes, plus larger expert matrices),
// with the bandwidth it reaches against a device-to-device copy measured in
// the same run. Prints one table (Markdown).
//
//   skewadam-cuda-bench [--quick] [--only SUBSTRING]
//
// --quick: fewer repetitions; --only: run only the benchmarks whose name
// contains SUBSTRING (the copy roofline always runs).
//
// Bandwidth counts the rule's compulsory traffic: each input read once, each
// output written once (experts G + 2P, backbone G + 8 + 2P, router G + 8 + 2P,
// AdamW G + 16 + 2P bytes per element, G and P the gradient's and the
// parameter's sizes; a rank-1 tensor under a factored tier is updated
// exactly, like the backbone's or the router's element-wise rule). The
// second read of the gradient (or of the momentum) that the clip's two passes
// need is not counted: on the GPU it can come from L2. This is stricter than
// the CPU bench (bench/skewadam_bench.cpp), which counts the two-pass bound.
// The figure is directly comparable with the copy's 2 bytes moved per byte
// copied. Times are the median of several repetitions of a batch of steps,
// timed with CUDA events (no host work in between).

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include <skewadam/engine/backend/cuda/device_buffer.cuh>
#include <skewadam/cuda.cuh>

#include "bench_params.hpp"

namespace {

using skewadam::Dtype;
using skewadam::index_t;
using skewadam::Shape;
using skewadam::Tier;
using skewadam::backend::cuda::check;
using skewadam::backend::cuda::DeviceBuffer;

using skewadam_bench::Kind;
using skewadam_bench::Param;
using skewadam_bench::kind_name;
using skewadam_bench::paper_model;

/// Compulsory bytes moved per element by one step (see the file comment).
index_t bytes_per_element(Kind k, Dtype dtype, bool rank1) {
  const index_t p = skewadam::dtype_size(dtype);
  const index_t g = p;
  if (rank1 && k == Kind::backbone) return g + 16 + 2 * p;  // m and v read and written
  switch (k) {
    case Kind::experts: return rank1 ? g + 8 + 2 * p : g + 2 * p;
    case Kind::backbone: return g + 8 + 2 * p;
    case Kind::router: return g + 8 + 2 * p;
    case Kind::adamw: return g + 16 + 2 * p;
  }
  return 0;
}

struct Events {
  cudaEvent_t a = nullptr, b = nullptr;
  Events() {
    check(cudaEventCreate(&a), "cudaEventCreate");
    check(cudaEventCreate(&b), "cudaEventCreate");
  }
  ~Events() {
    (void)cudaEventDestroy(a);
    (void)cudaEventDestroy(b);
  }
};

/// Fills n values of `dtype` at p with a deterministic pattern in [-scale, scale).
__global__ void fill_kernel(void* p, index_t n, int dtype, std::uint32_t seed, float scale) {
  for (index_t i = static_cast<index_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += static_cast<index_t>(gridDim.x) * blockDim.x) {
    std::uint32_t h = static_cast<std::uint32_t>(i) * 2654435761u ^ seed;
    h ^= h >> 15;
    h *= 2246822519u;
    h ^= h >> 13;
    const float x = scale * (static_cast<float>(h >> 8) * 0x1p-23f - 1.0f);
    if (dtype == 0) static_cast<float*>(p)[i] = x;
    else static_cast<skewadam::bf16*>(p)[i] = skewadam::bf16(x);
  }
}

void fill(void* p, index_t n, Dtype d, std::uint32_t seed, float scale) {
  fill_kernel<<<1024, 256>>>(p, n, d == Dtype::f32 ? 0 : 1, seed, scale);
  check(cudaGetLastError(), "fill_kernel");
}

/// Median milliseconds of `body` over `reps` batches of `batch` calls.
template <class F>
double median_ms(cudaStream_t s, int reps, int batch, F&& body) {
  Events ev;
  std::vector<double> t;
  for (int r = 0; r < reps; ++r) {
    check(cudaEventRecord(ev.a, s), "cudaEventRecord");
    for (int k = 0; k < batch; ++k) body();
    check(cudaEventRecord(ev.b, s), "cudaEventRecord");
    check(cudaEventSynchronize(ev.b), "cudaEventSynchronize");
    float ms = 0;
    check(cudaEventElapsedTime(&ms, ev.a, ev.b), "cudaEventElapsedTime");
    t.push_back(static_cast<double>(ms) / batch);
  }
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

struct Row {
  std::string name;
  double ms = 0;
  double gbps = 0;
  double elements = 0;
};

template <class Tiers>
Row time_steps(const std::string& name, const std::vector<Param>& params, cudaStream_t s, int reps) {
  skewadam::cuda::Optimizer<Tiers> opt(skewadam::Hyperparameters{.lr = 3e-4, .weight_decay = 0.05}, {.stream = s});
  std::vector<DeviceBuffer<std::uint8_t>> bufs;
  index_t bytes = 0, elements = 0;
  std::uint32_t seed = 1;
  for (const Param& p : params) {
    const index_t n = p.shape.numel();
    const auto sz = static_cast<std::size_t>(n * skewadam::dtype_size(p.dtype));
    bufs.emplace_back(sz);
    void* pp = bufs.back().data();
    bufs.emplace_back(sz);
    void* gp = bufs.back().data();
    fill(pp, n, p.dtype, seed++, 0.05f);
    fill(gp, n, p.dtype, seed++, 1e-3f);
    const Tier tier = skewadam_bench::tier_of(p.kind);
    if (p.dtype == Dtype::f32)
      opt.add(p.name, tier, skewadam::TensorView<float>(static_cast<float*>(pp), p.shape),
              skewadam::TensorView<const float>(static_cast<const float*>(gp), p.shape));
    else
      opt.add(p.name, tier, skewadam::TensorView<skewadam::bf16>(static_cast<skewadam::bf16*>(pp), p.shape),
              skewadam::TensorView<const skewadam::bf16>(static_cast<const skewadam::bf16*>(gp), p.shape));
    bytes += bytes_per_element(p.kind, p.dtype, p.shape.rank() < 2) * n;
    elements += n;
  }
  check(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
  opt.step();  // warm-up
  opt.synchronize();
  const int batch = std::max(1, static_cast<int>(std::min<index_t>(20, (index_t{1} << 31) / std::max<index_t>(bytes, 1))));
  Row r;
  r.name = name;
  r.ms = median_ms(s, reps, batch, [&] { opt.step(); });
  r.gbps = static_cast<double>(bytes) / (r.ms * 1e6);
  r.elements = static_cast<double>(elements);
  return r;
}

Row copy_roofline(cudaStream_t s, int reps) {
  const std::size_t bytes = std::size_t{1} << 30;  // 1 GiB each way
  DeviceBuffer<std::uint8_t> a(bytes), b(bytes);
  check(cudaMemset(a.data(), 1, bytes), "cudaMemset");
  check(cudaMemset(b.data(), 2, bytes), "cudaMemset");
  check(cudaDeviceSynchronize(), "cudaDeviceSynchronize");  // the memsets (legacy stream) before the copies on s
  Row r;
  r.name = "copy/device-to-device/1GiB";
  r.ms = median_ms(s, reps, 5, [&] {
    check(cudaMemcpyAsync(b.data(), a.data(), bytes, cudaMemcpyDeviceToDevice, s), "cudaMemcpyAsync");
  });
  r.gbps = 2.0 * static_cast<double>(bytes) / (r.ms * 1e6);  // read + write
  return r;
}

std::string shape_name(const Shape& s) {
  std::string out;
  for (int i = 0; i < s.rank(); ++i) {
    if (i) out.push_back('x');
    out.append(std::to_string(s[i]));
  }
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  bool quick = false;
  std::string only;
  for (int a = 1; a < argc; ++a) {
    if (std::strcmp(argv[a], "--quick") == 0) {
      quick = true;
    } else if (std::strcmp(argv[a], "--only") == 0 && a + 1 < argc) {
      only = argv[++a];
    } else {
      std::fprintf(stderr, "skewadam-cuda-bench: unknown argument '%s' (usage: [--quick] [--only SUBSTRING])\n", argv[a]);
      return 2;
    }
  }
  const auto wanted = [&](const std::string& name) { return only.empty() || name.find(only) != std::string::npos; };
  try {
    if (skewadam::cuda::device_count() == 0) {
      std::printf("SKIP: no CUDA device\n");
      return 77;
    }
    cudaDeviceProp prop{};
    check(cudaGetDeviceProperties(&prop, 0), "cudaGetDeviceProperties");
    cudaStream_t s = nullptr;
    check(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), "cudaStreamCreate");
    const int reps = quick ? 3 : 7;

    std::vector<Row> rows;
    const Row copy = copy_roofline(s, reps);
    rows.push_back(copy);
    struct One {
      Kind kind;
      Shape shape;
    };
    std::vector<One> singles = {
        {Kind::router, Shape{128, 4096}},    {Kind::experts, Shape{4096, 2048}}, {Kind::experts, Shape{4096, 4096}},
        {Kind::experts, Shape{8, 1024, 2048}}, {Kind::backbone, Shape{4096, 4096}}, {Kind::adamw, Shape{4096, 2048}},
        {Kind::adamw, Shape{4096, 4096}},    {Kind::experts, Shape{8192, 8192}},  {Kind::experts, Shape{16, 4096, 4096}},
    };
    for (Dtype dtype : {Dtype::f32, Dtype::bf16})
      for (const One& o : singles) {
        const std::string name = std::string("step/") + kind_name(o.kind) + "/" + std::string(skewadam::dtype_name(dtype)) +
                                 "/" + shape_name(o.shape);
        if (!wanted(name)) continue;
        const std::vector<Param> ps = {Param{"w", o.kind, o.shape, dtype}};
        rows.push_back(o.kind == Kind::adamw ? time_steps<skewadam::AdamWTiers>(name, ps, s, reps)
                                             : time_steps<skewadam::SkewAdamTiers>(name, ps, s, reps));
      }
    for (Dtype dtype : {Dtype::f32, Dtype::bf16}) {
      std::vector<Param> small;
      for (int i = 0; i < 64; ++i) {
        small.push_back({"m" + std::to_string(i), Kind::backbone, Shape{64, 256}, dtype});
        small.push_back({"v" + std::to_string(i), Kind::backbone, Shape{256}, dtype});
      }
      const std::string name = "step/backbone/" + std::string(skewadam::dtype_name(dtype)) + "/128tensors_64x256_256";
      if (wanted(name)) rows.push_back(time_steps<skewadam::SkewAdamTiers>(name, small, s, reps));
    }
    // 128 experts of 512x1024 stored as separate tensors, and the same
    // experts as one stacked bank [128, 512, 1024]: the list should step as
    // fast as the bank.
    for (Dtype dtype : {Dtype::f32, Dtype::bf16}) {
      const std::string dt(skewadam::dtype_name(dtype));
      std::vector<Param> list;
      for (int i = 0; i < 128; ++i) list.push_back({"e" + std::to_string(i), Kind::experts, Shape{512, 1024}, dtype});
      const std::string list_name = "step/experts/" + dt + "/128tensors_512x1024";
      if (wanted(list_name)) rows.push_back(time_steps<skewadam::SkewAdamTiers>(list_name, list, s, reps));
      const std::string bank_name = "step/experts/" + dt + "/128x512x1024";
      if (wanted(bank_name))
        rows.push_back(time_steps<skewadam::SkewAdamTiers>(bank_name, {Param{"w", Kind::experts, Shape{128, 512, 1024}, dtype}},
                                                           s, reps));
    }
    for (Dtype dtype : {Dtype::f32, Dtype::bf16}) {
      const std::string dt(skewadam::dtype_name(dtype));
      if (wanted("model/skewadam/" + dt + "/paper53M"))
        rows.push_back(time_steps<skewadam::SkewAdamTiers>("model/skewadam/" + dt + "/paper53M", paper_model(dtype, false), s, reps));
      if (wanted("model/adamw/" + dt + "/paper53M"))
        rows.push_back(time_steps<skewadam::AdamWTiers>("model/adamw/" + dt + "/paper53M", paper_model(dtype, true), s, reps));
    }

    std::printf("device: %s, %d SMs, sm_%d%d\n\n", prop.name, prop.multiProcessorCount, prop.major, prop.minor);
    std::printf("| benchmark | ms per step | GB/s (compulsory traffic) | %% of copy |\n|---|---:|---:|---:|\n");
    for (const Row& r : rows)
      std::printf("| %s | %.4f | %.0f | %.0f %% |\n", r.name.c_str(), r.ms, r.gbps, 100.0 * r.gbps / copy.gbps);
    (void)cudaStreamDestroy(s);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "skewadam-cuda-bench: %s\n", e.what());
    return 1;
  }
  return 0;
}
