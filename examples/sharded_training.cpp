// Data-parallel training with SkewAdam's state sharded over MPI ranks.
//
//   mpirun -np 2 sharded_training [--steps N] [--batch B]
//
// A small mixture-of-experts regression model (as in toy_moe, with dense
// softmax gates):
//   a = tanh(W_in x)                              backbone, [hidden, in]
//   g = softmax(W_router a)                       router, [E, hidden]
//   y = sum_k g_k W_experts[k] a                  experts, a bank [E, out, hidden]
//   loss = 0.5 |y - target|^2, targets from a fixed random teacher
// Every rank holds the whole model and draws its own batches (rank-seeded);
// gradients are averaged over the ranks (an all-reduce, as a data-parallel
// framework does), then the ShardedOptimizer updates each rank's shard only
// (row slices of W_in and W_router, whole experts of the bank) and the ranks
// gather the parameters. Rank 0 prints the loss averaged over the ranks, the
// state each rank keeps and the bytes the optimizer exchanged. Exits 1 unless
// the mean loss of the last tenth of the steps is below 3/4 of the first's.

#include <Eigen/Core>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <span>
#include <string>
#include <vector>

#include <skewadam/dist/sharded_optimizer.hpp>
#include <skewadam/mpi/communicator.hpp>
#include <skewadam/skewadam.hpp>

namespace {

using Mat = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
using Vec = Eigen::VectorXf;

constexpr int kIn = 32, kHidden = 64, kOut = 16, kExperts = 8;

struct Model {
  Mat w_in = Mat(kHidden, kIn);
  Mat router = Mat(kExperts, kHidden);
  Mat experts = Mat(kExperts * kOut, kHidden);  // bank [E, out, hidden], row-major

  static Model random(std::uint32_t seed, float scale) {
    Model m;
    std::mt19937 gen(seed);
    std::normal_distribution<float> d(0.0f, scale);
    for (Mat* w : {&m.w_in, &m.router, &m.experts})
      for (Eigen::Index i = 0; i < w->size(); ++i) w->data()[i] = d(gen);
    return m;
  }
  Vec forward(const Vec& x, Vec& a, Vec& g) const {
    a = (w_in * x).array().tanh();
    const Vec logits = router * a;
    g = (logits.array() - logits.maxCoeff()).exp();
    g /= g.sum();
    Vec y = Vec::Zero(kOut);
    for (int k = 0; k < kExperts; ++k) y += g[k] * (experts.middleRows(k * kOut, kOut) * a);
    return y;
  }
};

/// Adds one sample's gradients to `grad`; returns its loss.
float backward(const Model& m, const Vec& x, const Vec& target, Model& grad) {
  Vec a, g;
  const Vec y = m.forward(x, a, g);
  const Vec dy = y - target;
  Vec dg(kExperts);
  Vec da = Vec::Zero(kHidden);
  for (int k = 0; k < kExperts; ++k) {
    const auto wk = m.experts.middleRows(k * kOut, kOut);
    dg[k] = dy.dot(wk * a);
    grad.experts.middleRows(k * kOut, kOut) += g[k] * dy * a.transpose();
    da += g[k] * (wk.transpose() * dy);
  }
  const Vec dlogits = g.array() * (dg.array() - g.dot(dg));
  grad.router += dlogits * a.transpose();
  da += m.router.transpose() * dlogits;
  const Vec dpre = da.array() * (1.0f - a.array().square());
  grad.w_in += dpre * x.transpose();
  return 0.5f * dy.squaredNorm();
}

}  // namespace

int main(int argc, char** argv) {
  using namespace skewadam;
  mpi::Environment env(argc, argv);
  mpi::MpiCommunicator comm;
  int steps = 300, batch = 32;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string flag = argv[i];
    if (flag == "--steps") steps = std::atoi(argv[i + 1]);
    else if (flag == "--batch") batch = std::atoi(argv[i + 1]);
  }
  if (steps < 1 || batch < 1) {
    if (comm.rank() == 0) std::fprintf(stderr, "usage: sharded_training [--steps N >= 1] [--batch B >= 1]\n");
    return 2;
  }

  const Model teacher = Model::random(1, 0.5f);
  Model model = Model::random(2, 0.1f);  // the same initialisation on every rank
  Model grad = Model::random(0, 0.0f);

  PerTier<Hyperparameters> hyper;
  hyper.backbone = {.lr = 3e-2, .weight_decay = 0.01};
  hyper.experts = {.lr = 3e-2, .weight_decay = 0.01};
  hyper.router = {.lr = 3e-2};
  dist::ShardedOptimizer<SkewAdamTiers, mpi::MpiCommunicator> opt(comm, hyper);
  opt.add("w_in", Tier::backbone, TensorView<float>(model.w_in.data(), {kHidden, kIn}),
          TensorView<const float>(grad.w_in.data(), {kHidden, kIn}));
  opt.add("router", Tier::router, TensorView<float>(model.router.data(), {kExperts, kHidden}),
          TensorView<const float>(grad.router.data(), {kExperts, kHidden}));
  opt.add("experts", Tier::experts, TensorView<float>(model.experts.data(), {kExperts, kOut, kHidden}),
          TensorView<const float>(grad.experts.data(), {kExperts, kOut, kHidden}));
  opt.set_lr_schedule(WarmupCosine{.peak_lr = 3e-2, .warmup_steps = steps / 30, .total_steps = steps});

  std::mt19937 gen(1000u + static_cast<std::uint32_t>(comm.rank()));  // each rank its own data
  std::normal_distribution<float> d(0.0f, 1.0f);
  const float inv = 1.0f / static_cast<float>(batch * comm.size());
  const int window = steps / 10 > 0 ? steps / 10 : 1;
  double first_loss = 0, last_loss = 0;  // mean over the first and the last `window` steps
  for (int step = 1; step <= steps; ++step) {
    grad.w_in.setZero();
    grad.router.setZero();
    grad.experts.setZero();
    double loss = 0;
    for (int b = 0; b < batch; ++b) {
      Vec x(kIn);
      for (int i = 0; i < kIn; ++i) x[i] = d(gen);
      Vec a, g;
      const Vec target = teacher.forward(x, a, g);
      loss += backward(model, x, target, grad);
    }
    // data parallelism: average the gradients (and the loss) over the ranks
    for (Mat* w : {&grad.w_in, &grad.router, &grad.experts}) {
      comm.all_reduce_sum(std::span<float>(w->data(), static_cast<std::size_t>(w->size())));
      *w *= inv;
    }
    comm.all_reduce_sum(std::span<double>(&loss, 1));
    if (step <= window) first_loss += loss / (batch * comm.size()) / window;
    if (step > steps - window) last_loss += loss / (batch * comm.size()) / window;
    opt.clip_grad_norm(1.0);
    opt.step();
    opt.gather_params();
    if (comm.rank() == 0 && (step == 1 || step % (steps / 10 > 0 ? steps / 10 : 1) == 0))
      std::printf("step %4d  loss %.5f\n", step, loss / (batch * comm.size()));
  }

  const std::vector<index_t> bytes = opt.state_bytes_per_rank();
  if (comm.rank() == 0) {
    std::printf("\n%d ranks; optimizer state per rank:", comm.size());
    for (index_t b : bytes) std::printf(" %lld", static_cast<long long>(b));
    std::printf(" bytes\noptimizer exchange per step: %lld bytes from each rank\n",
                static_cast<long long>(opt.last_step_exchange_bytes()));
    std::printf("mean loss: first %d steps %.4f, last %d steps %.4f\n", window, first_loss, window, last_loss);
  }
  // the loss must have come down (every rank has the same figures)
  return last_loss < 0.75 * first_loss ? 0 : 1;
}
