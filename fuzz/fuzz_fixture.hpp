#pragma once
// The optimizer the checkpoint fuzzer loads into, and the checkpoints its
// seed corpus starts from: every tier, f32 / bf16 / f16 parameters, rank 1 to
// 3, a few steps of deterministic gradients.

#include <cstdint>
#include <cstring>
#include <vector>

#include <skewadam/skewadam.hpp>

namespace fuzz {

struct Fixture {
  std::vector<float> embed = std::vector<float>(6 * 5), router = std::vector<float>(3 * 5);
  std::vector<skewadam::bf16> w1 = std::vector<skewadam::bf16>(2 * 4 * 3);
  std::vector<skewadam::f16> bias = std::vector<skewadam::f16>(5);
  std::vector<float> g_embed = std::vector<float>(embed.size()), g_router = std::vector<float>(router.size()),
                     g_w1 = std::vector<float>(w1.size()), g_bias = std::vector<float>(bias.size());
  skewadam::SkewAdam opt{skewadam::Hyperparameters{.lr = 1e-2, .weight_decay = 0.05},
                         skewadam::OptimizerOptions{.seed = 7, .threads = 1}};

  Fixture() {
    using namespace skewadam;
    for (std::size_t i = 0; i < embed.size(); ++i) embed[i] = 0.01f * static_cast<float>(i);
    for (std::size_t i = 0; i < router.size(); ++i) router[i] = -0.02f * static_cast<float>(i);
    for (std::size_t i = 0; i < w1.size(); ++i) w1[i] = bf16(0.03f * static_cast<float>(i));
    for (std::size_t i = 0; i < bias.size(); ++i) bias[i] = f16(0.1f);
    opt.add("embed", Tier::backbone, TensorView<float>(embed.data(), {6, 5}), TensorView<const float>(g_embed.data(), {6, 5}));
    opt.add("moe.w1", Tier::experts, TensorView<bf16>(w1.data(), {2, 4, 3}), TensorView<const float>(g_w1.data(), {2, 4, 3}));
    opt.add("moe.router", Tier::router, TensorView<float>(router.data(), {3, 5}),
            TensorView<const float>(g_router.data(), {3, 5}));
    opt.add("bias", Tier::backbone, TensorView<f16>(bias.data(), {5}), TensorView<const float>(g_bias.data(), {5}));
  }

  void train(int steps) {
    for (int t = 1; t <= steps; ++t) {
      for (auto* g : {&g_embed, &g_router, &g_w1, &g_bias})
        for (std::size_t i = 0; i < g->size(); ++i)
          (*g)[i] = 0.05f * static_cast<float>((static_cast<int>(i) * 7 + t * 3) % 11 - 5);
      opt.step();
    }
  }

  /// The parameters' bits.
  std::vector<unsigned char> param_bits() const {
    std::vector<unsigned char> b;
    auto put = [&](const void* p, std::size_t n) {
      const auto* c = static_cast<const unsigned char*>(p);
      b.insert(b.end(), c, c + n);
    };
    put(embed.data(), 4 * embed.size());
    put(router.data(), 4 * router.size());
    put(w1.data(), 2 * w1.size());
    put(bias.data(), 2 * bias.size());
    return b;
  }
};

}  // namespace fuzz
