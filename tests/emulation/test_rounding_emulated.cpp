// Stochastic rounding on the CUDA backend (engine/backend/cuda/cuda_backend.hpp) over the
// emulated runtime: the CUDA kernels draw each element's 16 random bits from
// the same Philox block as the CPU backend (random.hpp), on every walk of the
// kernels (aligned quads of 8-element blocks, quads whose blocks straddle
// rows, the scalar walk, element-wise tensors), so bf16 and fp16 parameters
// get the CPU backend's bits. (Both compile without contraction here, as
// the CUDA kernels do: tests/cuda_emulation_tests.cmake.)

#include <doctest/doctest.h>

#include <skewadam_tools/emulated_runtime.hpp>

#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include <skewadam/skewadam.hpp>

namespace test_rounding_emulated {

namespace {

using namespace skewadam;

/// One tensor of 16-bit parameters and its gradients, k / 64 with |k| <= 31:
/// every sum of squares the step forms is exact in fp32 in any order, so the
/// fp32 values rounded are the same on both backends whatever the order of
/// their reductions, and the bits depend only on the rounding.
template <class P, class G>
struct Tensor {
  std::string name;
  Tier tier;
  Shape shape;
  std::vector<P> param;
  std::vector<G> grad;

  Tensor(std::string n, Tier t, Shape s, std::uint64_t seed) : name(std::move(n)), tier(t), shape(s) {
    const auto count = static_cast<std::size_t>(shape.numel());
    param.resize(count);
    grad.resize(count);
    std::uint64_t x = seed * 0x9E3779B97F4A7C15ULL + 1;
    for (auto& p : param) {
      x = x * 6364136223846793005ULL + 1442695040888963407ULL;
      p = P(static_cast<float>(static_cast<std::int32_t>(x >> 40) % 1000) * 5e-5f);
    }
  }
  void fill(std::int64_t step) {
    for (std::size_t i = 0; i < grad.size(); ++i)
      grad[i] = G(static_cast<float>(static_cast<std::int64_t>((i * 7 + static_cast<std::size_t>(step) * 13) % 63) - 31) /
                  64.0f);
  }
};

template <class Tiers, class P, class G>
void check_same_bits(const std::string& variant) {
  CAPTURE(variant);
  const std::string dtypes = std::string(dtype_name(dtype_of<P>())) + " parameters, " +
                             std::string(dtype_name(dtype_of<G>())) + " gradients";
  CAPTURE(dtypes);
  // the walks: aligned quads with whole 8-element blocks per row (96 columns),
  // quads whose blocks straddle two rows (20 columns), the scalar walk (13
  // columns), a stacked bank, an element-wise router and a rank-1 tensor
  const Tensor<P, G> shapes[] = {{"blocks.0.w", Tier::backbone, Shape{40, 96}, 1},
                                 {"blocks.0.v", Tier::backbone, Shape{33, 20}, 2},
                                 {"blocks.0.odd", Tier::backbone, Shape{7, 13}, 3},
                                 {"moe.experts.w1", Tier::experts, Shape{3, 16, 24}, 4},
                                 {"moe.experts.w2", Tier::experts, Shape{5, 12, 36}, 5},
                                 {"moe.router", Tier::router, Shape{8, 44}, 6},
                                 {"ln.bias", Tier::backbone, Shape{61}, 7}};
  std::vector<Tensor<P, G>> cpu(std::begin(shapes), std::end(shapes)), emu = cpu;
  PerTier<Hyperparameters> h;
  h.backbone = h.experts = {.lr = 1e-3, .weight_decay = 0.05, .clip_threshold = 1000.0};
  h.router = {.lr = 1e-3, .clip_threshold = 1000.0};
  Optimizer<Tiers> a(h, OptimizerOptions{.seed = 11, .threads = 2});
  Optimizer<Tiers, tools::EmulatedCuda> b(h, OptimizerOptions{.seed = 11});
  for (std::size_t i = 0; i < cpu.size(); ++i) {
    a.add(cpu[i].name, cpu[i].tier, TensorView<P>(cpu[i].param.data(), cpu[i].shape),
          TensorView<const G>(cpu[i].grad.data(), cpu[i].shape));
    b.add(emu[i].name, emu[i].tier, TensorView<P>(emu[i].param.data(), emu[i].shape),
          TensorView<const G>(emu[i].grad.data(), emu[i].shape));
  }
  const auto before = cpu;
  for (std::int64_t t = 1; t <= 3; ++t) {
    for (auto& x : cpu) x.fill(t);
    for (auto& x : emu) x.fill(t);
    a.step();
    b.step();
  }
  for (std::size_t i = 0; i < cpu.size(); ++i) {
    CAPTURE(cpu[i].name);
    const auto n = cpu[i].param.size() * sizeof(P);
    std::size_t differ = 0;
    for (std::size_t k = 0; k < cpu[i].param.size(); ++k)
      differ += std::memcmp(&cpu[i].param[k], &emu[i].param[k], sizeof(P)) != 0 ? 1 : 0;
    CHECK(differ == 0);
    // and the steps moved the parameters: the comparison is not trivially true
    CHECK(std::memcmp(cpu[i].param.data(), before[i].param.data(), n) != 0);
  }
}

}  // namespace

TEST_CASE("stochastic rounding: the CUDA kernels give the CPU backend's bf16 and fp16 bits on every walk") {
  check_same_bits<SkewAdamTiers, bf16, float>("SkewAdam");
  check_same_bits<SkewAdamTiers, bf16, bf16>("SkewAdam");
  check_same_bits<SkewAdamTiers, f16, float>("SkewAdam");
  check_same_bits<UniformTiers, bf16, float>("uniform");
  check_same_bits<AdafactorTiers, f16, f16>("Adafactor-like");
  check_same_bits<AdamWTiers, bf16, float>("AdamW");
}

}  // namespace test_rounding_emulated
