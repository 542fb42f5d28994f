#pragma once
// Shared helpers of the LibTorch adapter tests. Their tensors live on
// test_device(): the CPU, or the GPU in skewadam-torch-cuda-tests (built
// against a CUDA LibTorch with SKEWADAM_TORCH_TEST_CUDA defined), where the
// same tests run on CUDA tensors.

#include <skewadam/torch/optimizer.hpp>
#include <torch/torch.h>

#include <cstdint>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

namespace skewadam_torch_test {

using Named = std::vector<std::pair<std::string, torch::Tensor>>;

/// Where the tests' tensors live.
inline torch::Device test_device() {
#if defined(SKEWADAM_TORCH_TEST_CUDA)
  return {torch::kCUDA, 0};
#else
  return torch::kCPU;
#endif
}

/// Whether this test program registers a device engine for test_device()
/// that every variant must run on: the CUDA engines (skewadam-torch-cuda-tests),
/// or the emulated ones (skewadam-torch-device-tests, whose registration sets
/// it); false where the CPU core is the engine.
inline bool& device_engine_expected() {
#if defined(SKEWADAM_TORCH_TEST_CUDA)
  static bool expected = true;
#else
  static bool expected = false;
#endif
  return expected;
}

/// `t` on the test device (the same tensor when it is there already).
inline torch::Tensor on(const torch::Tensor& t) { return t.to(test_device()); }

/// A small MoE-like parameter set covering every tier, ranks 0 to 3, fp32 and
/// bf16 (deterministic values), on the test device.
inline Named make_params(bool with_bf16 = true) {
  torch::manual_seed(7);
  Named p;
  p.emplace_back("tok_emb.weight", torch::randn({40, 16}) * 0.1);
  p.emplace_back("blocks.0.ln1.weight", torch::ones({16}) + torch::randn({16}) * 0.01);
  p.emplace_back("blocks.0.attn.qkv.weight", torch::randn({48, 16}) * 0.1);
  p.emplace_back("blocks.1.moe.router.weight", torch::randn({4, 16}) * 0.1);
  p.emplace_back("blocks.1.moe.experts.gate_proj", torch::randn({4, 16, 24}) * 0.1);
  p.emplace_back("blocks.1.moe.experts.down_proj", torch::randn({4, 24, 16}) * 0.1);
  p.emplace_back("logit_scale", torch::ones({}));
  if (with_bf16) {
    p.emplace_back("blocks.1.moe.experts.up_proj", (torch::randn({4, 16, 24}) * 0.1).to(torch::kBFloat16));
    p.emplace_back("blocks.0.ffn.gate_proj.weight", (torch::randn({24, 16}) * 0.1).to(torch::kBFloat16));
  }
  for (auto& [name, t] : p) t = on(t);
  return p;
}

/// The tests' options: a learning rate of its own for each tier, weight
/// decay on backbone and experts.
inline skewadam::libtorch::Options test_options(std::uint64_t seed = 5) {
  skewadam::libtorch::Options o;
  o.hyperparameters.backbone = {.lr = 2e-3, .weight_decay = 0.05};
  o.hyperparameters.experts = {.lr = 3e-3, .weight_decay = 0.05};
  o.hyperparameters.router = {.lr = 1e-3};
  o.seed = seed;
  return o;
}

/// Independent copies (new storage) of a parameter set.
inline Named clone(const Named& ps) {
  Named out;
  for (const auto& [n, t] : ps) out.emplace_back(n, t.detach().clone());
  return out;
}

/// Gradients of step k (1-based) for a parameter set: fixed by (k, index), in
/// the parameter's dtype and on its device. Parameter `skip` gets none on steps
/// where k % 3 == 0.
inline std::vector<torch::Tensor> grads_for_step(const Named& ps, int k, std::size_t skip = 2) {
  std::vector<torch::Tensor> g;
  for (std::size_t i = 0; i < ps.size(); ++i) {
    if (i == skip && k % 3 == 0) {
      g.emplace_back();
      continue;
    }
    torch::manual_seed(1000 * static_cast<std::uint64_t>(k) + i);
    g.push_back((torch::randn(ps[i].second.sizes()) * (0.01 * static_cast<double>(i + 1)))
                    .to(ps[i].second.device(), ps[i].second.scalar_type()));
  }
  return g;
}

inline void set_grads(const Named& ps, const std::vector<torch::Tensor>& g) {
  for (std::size_t i = 0; i < ps.size(); ++i) {
    if (g[i].defined()) ps[i].second.mutable_grad() = g[i].clone();
    else ps[i].second.mutable_grad() = torch::Tensor();
  }
}

/// True when both tensors hold exactly the same bytes (wherever each lives).
inline bool same_bits(const torch::Tensor& a, const torch::Tensor& b) {
  if (a.scalar_type() != b.scalar_type() || a.sizes() != b.sizes()) return false;
  const auto ca = a.to(torch::kCPU).contiguous(), cb = b.to(torch::kCPU).contiguous();
  return std::memcmp(ca.data_ptr(), cb.data_ptr(), static_cast<std::size_t>(ca.nbytes())) == 0;
}

inline bool same_bits(const Named& a, const Named& b) {
  if (a.size() != b.size()) return false;
  for (std::size_t i = 0; i < a.size(); ++i)
    if (a[i].first != b[i].first || !same_bits(a[i].second, b[i].second)) return false;
  return true;
}

}  // namespace skewadam_torch_test
