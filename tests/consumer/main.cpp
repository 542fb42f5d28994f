// Builds against skewadam as an outside project would.
#include <skewadam/skewadam.hpp>

#include <cstdio>
#include <vector>

int main() {
  std::vector<float> w(64 * 32, 0.1f), g(64 * 32, 0.01f);
  skewadam::SkewAdam opt(skewadam::Hyperparameters{.lr = 1e-3});
  opt.add("experts.w", skewadam::Tier::experts, skewadam::TensorView<float>(w.data(), {64, 32}),
          skewadam::TensorView<const float>(g.data(), {64, 32}));
  opt.step();
  std::printf("skewadam %d.%d.%d: state %lld bytes, w[0] = %g\n", skewadam::version_major, skewadam::version_minor,
              skewadam::version_patch, static_cast<long long>(opt.state_bytes()), static_cast<double>(w[0]));
  return opt.state_bytes() == 4 * (64 + 32) && w[0] < 0.1f ? 0 : 1;
}
