// A toy mixture-of-experts regression model trained with SkewAdam's three
// tiers, next to AdamW, Adafactor-like and the uniform ablation, from the same
// initialisation on the same batches. Prints the loss and each optimizer's
// state per tier.
//
//   a = tanh(W_in x + b_in)                      backbone
//   logits = W_router a, top-2, softmax gates    router
//   y = sum_k gate_k * W_experts[k] a            experts, a stacked bank [E, out, hidden]
//   loss = 0.5 |y - target|^2, target from a fixed random "teacher" of the same shape
//
// Gradients are computed by hand (no autograd), with Eigen.
//
//   toy_moe [--steps N] [--batch B] [--threads T]

#include <Eigen/Core>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include <skewadam/eigen_view.hpp>
#include <skewadam/skewadam.hpp>

namespace {

using Mat = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
using Vec = Eigen::VectorXf;

constexpr int kIn = 32, kHidden = 64, kOut = 16, kExperts = 8, kTopK = 2;

struct Model {
  Mat w_in = Mat(kHidden, kIn);
  Vec b_in = Vec(kHidden);
  Mat router = Mat(kExperts, kHidden);
  Mat experts = Mat(kExperts * kOut, kHidden);  // bank [E, out, hidden], row-major

  void init(std::mt19937& gen, float scale) {
    std::normal_distribution<float> n(0.0f, 1.0f);
    auto fill = [&](auto& m, float s) {
      for (Eigen::Index i = 0; i < m.size(); ++i) m.data()[i] = s * n(gen);
    };
    fill(w_in, scale / std::sqrt(float(kIn)));
    fill(b_in, 0.1f);
    fill(router, scale / std::sqrt(float(kHidden)));
    fill(experts, scale / std::sqrt(float(kHidden)));
  }
  auto expert(int e) { return experts.middleRows(e * kOut, kOut); }
  auto expert(int e) const { return experts.middleRows(e * kOut, kOut); }
};

/// Forward pass for one sample; with `grad`, accumulates gradients of the loss.
float forward(const Model& m, const Vec& x, const Vec& target, Model* grad, Vec* prediction = nullptr) {
  const Vec a = (m.w_in * x + m.b_in).array().tanh().matrix();
  const Vec logits = m.router * a;
  int top[kTopK] = {0, 1};
  if (logits[1] > logits[0]) std::swap(top[0], top[1]);
  for (int e = 2; e < kExperts; ++e) {
    if (logits[e] > logits[top[0]]) {
      top[1] = top[0];
      top[0] = e;
    } else if (logits[e] > logits[top[1]]) {
      top[1] = e;
    }
  }
  const float z = std::exp(logits[top[1]] - logits[top[0]]);
  const float gate[kTopK] = {1.0f / (1.0f + z), z / (1.0f + z)};
  Vec out[kTopK];
  Vec y = Vec::Zero(kOut);
  for (int k = 0; k < kTopK; ++k) {
    out[k] = m.expert(top[k]) * a;
    y += gate[k] * out[k];
  }
  if (prediction) *prediction = y;
  const Vec dy = y - target;
  if (grad) {
    Vec da = Vec::Zero(kHidden);
    float dgate[kTopK];
    for (int k = 0; k < kTopK; ++k) {
      grad->expert(top[k]).noalias() += gate[k] * dy * a.transpose();
      da.noalias() += gate[k] * m.expert(top[k]).transpose() * dy;
      dgate[k] = dy.dot(out[k]);
    }
    const float mean = gate[0] * dgate[0] + gate[1] * dgate[1];
    for (int k = 0; k < kTopK; ++k) {
      const float dl = gate[k] * (dgate[k] - mean);
      grad->router.row(top[k]) += dl * a.transpose();
      da += dl * m.router.row(top[k]).transpose();
    }
    const Vec dz = da.array() * (1.0f - a.array().square());
    grad->w_in.noalias() += dz * x.transpose();
    grad->b_in += dz;
  }
  return 0.5f * dy.squaredNorm();
}

Vec predict(const Model& m, const Vec& x) {
  Vec y;
  forward(m, x, Vec::Zero(kOut), nullptr, &y);
  return y;
}

struct Result {
  std::string name;
  double first_loss = 0, final_loss = 0;
  skewadam::index_t state[3] = {0, 0, 0};
};

template <class Opt>
Result train(const char* name, const Model& init, const Model& teacher, int steps, int batch, int threads) {
  Model m = init;
  Model g = init;
  Opt opt(skewadam::Hyperparameters{.lr = 3e-3, .weight_decay = 0.0}, skewadam::OptimizerOptions{.threads = threads});
  using skewadam::Tier;
  using skewadam::eigen_view;
  opt.add("backbone.w_in", Tier::backbone, eigen_view(m.w_in), eigen_view(std::as_const(g.w_in)));
  opt.add("backbone.b_in", Tier::backbone, eigen_view(m.b_in), eigen_view(std::as_const(g.b_in)));
  opt.add("moe.router", Tier::router, eigen_view(m.router), eigen_view(std::as_const(g.router)));
  // the bank [E, out, hidden]: E separate factored statistics
  opt.add("moe.experts", Tier::experts, skewadam::TensorView<float>(m.experts.data(), {kExperts, kOut, kHidden}),
          skewadam::TensorView<const float>(g.experts.data(), {kExperts, kOut, kHidden}));
  opt.set_lr_schedule(skewadam::WarmupCosine{.peak_lr = 3e-3, .warmup_steps = steps / 20, .total_steps = steps});

  std::mt19937 gen(7);  // identical batches for every optimizer
  std::normal_distribution<float> n(0.0f, 1.0f);
  Result r{name};
  double window = 0;
  for (int step = 1; step <= steps; ++step) {
    g.w_in.setZero();
    g.b_in.setZero();
    g.router.setZero();
    g.experts.setZero();
    double loss = 0;
    for (int b = 0; b < batch; ++b) {
      Vec x(kIn);
      for (auto& v : x) v = n(gen);
      const Vec t = predict(teacher, x);
      loss += forward(m, x, t, &g);
    }
    const float inv = 1.0f / float(batch);
    g.w_in *= inv;
    g.b_in *= inv;
    g.router *= inv;
    g.experts *= inv;
    loss /= batch;
    opt.clip_grad_norm(1.0);
    opt.step();
    if (step <= 10) r.first_loss += loss / 10;
    if (step > steps - 10) window += loss / 10;
  }
  r.final_loss = window;
  for (int t = 0; t < 3; ++t) r.state[t] = opt.state_bytes(static_cast<Tier>(t));
  return r;
}

int arg(int argc, char** argv, const char* flag, int fallback) {
  for (int i = 1; i + 1 < argc; ++i)
    if (std::strcmp(argv[i], flag) == 0) {
      char* end = nullptr;
      const long v = std::strtol(argv[i + 1], &end, 10);
      if (*end != '\0' || v < 1 || v > 1000000) {
        std::fprintf(stderr, "toy_moe: %s needs a positive integer, got '%s'\n", flag, argv[i + 1]);
        std::exit(2);
      }
      return static_cast<int>(v);
    }
  return fallback;
}

}  // namespace

int main(int argc, char** argv) {
  const int steps = arg(argc, argv, "--steps", 400);
  const int batch = arg(argc, argv, "--batch", 32);
  const int threads = arg(argc, argv, "--threads", 1);
  std::mt19937 gen(1);
  Model teacher, init;
  teacher.init(gen, 1.0f);
  init.init(gen, 0.5f);

  std::printf("toy MoE: %d experts (top-%d), hidden %d, %d steps of %d samples\n\n", kExperts, kTopK, kHidden, steps,
              batch);
  const Result results[] = {
      train<skewadam::SkewAdam>("SkewAdam", init, teacher, steps, batch, threads),
      train<skewadam::AdamW>("AdamW", init, teacher, steps, batch, threads),
      train<skewadam::AdafactorLike>("Adafactor-like", init, teacher, steps, batch, threads),
      train<skewadam::UniformAblation>("uniform", init, teacher, steps, batch, threads),
  };
  std::printf("%-15s %10s %10s %14s %14s %14s %12s\n", "optimizer", "loss@1-10", "loss@end", "backbone B",
              "experts B", "router B", "total B");
  for (const Result& r : results)
    std::printf("%-15s %10.4f %10.4f %14lld %14lld %14lld %12lld\n", r.name.c_str(), r.first_loss, r.final_loss,
                static_cast<long long>(r.state[0]), static_cast<long long>(r.state[1]),
                static_cast<long long>(r.state[2]), static_cast<long long>(r.state[0] + r.state[1] + r.state[2]));
  const auto total = [](const Result& r) { return double(r.state[0] + r.state[1] + r.state[2]); };
  std::printf("\nSkewAdam keeps %.1f%% of AdamW's optimizer state.\n", 100.0 * total(results[0]) / total(results[1]));
  const bool learned = results[0].final_loss < 0.5 * results[0].first_loss;
  if (!learned) std::printf("SkewAdam's loss did not halve: something is wrong\n");
  return learned ? 0 : 1;
}
