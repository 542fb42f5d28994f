// A short training run of the demo's MoE language model: the loss decreases
// with SkewAdam used through torch's Optimizer interface, with fp32 and with
// bf16 parameters.

#include <skewadam/torch/optimizer.hpp>

#include "doctest_torch.hpp"

#include <torch/torch.h>

#include <string>
#include <vector>

#include "corpus.hpp"
#include "model.hpp"
#include "torch_test_support.hpp"

namespace test_training {

namespace {

using skewadam_torch_test::test_device;

std::string small_corpus() {
  const std::vector<std::string> lines{
      "In the beginning God created the heaven and the earth.\n",
      "And the earth was without form, and void; and darkness was upon the face of the deep.\n",
      "And God said, Let there be light: and there was light.\n",
      "And God saw the light, that it was good: and God divided the light from the darkness.\n",
      "And God called the light Day, and the darkness he called Night.\n",
  };
  std::string text;
  for (int i = 0; text.size() < 200000; ++i) text += lines[static_cast<std::size_t>(i * 7 % 5)];
  return text;
}

/// Mean training loss over the first and the last `window` of `steps` steps.
std::pair<double, double> train(torch::ScalarType dtype, int steps, int window) {
  moe_lm::ModelConfig c;
  c.d_model = 32;
  c.heads = 2;
  c.context = 32;
  c.layers = 2;
  c.dense_ff = 64;
  c.experts = 8;
  c.expert_ff = 32;
  c.device = test_device();
  torch::manual_seed(3);
  moe_lm::MoELM model(c);
  model->to(dtype);
  const moe_lm::Corpus corpus = moe_lm::split_corpus(small_corpus(), "test");
  moe_lm::BatchSampler sampler(corpus.train, 8, c.context, 11);

  skewadam::libtorch::Options o;
  o.hyperparameters.backbone = {.lr = 1e-2, .weight_decay = 0.05};
  o.hyperparameters.experts = {.lr = 1e-2, .weight_decay = 0.05};
  o.hyperparameters.router = {.lr = 1e-2};
  o.max_grad_norm = 1.0;
  o.threads = 2;
  skewadam::libtorch::SkewAdam skew(model->named_parameters(), o);
  torch::optim::Optimizer& opt = skew;  // used only through torch's interface

  double first = 0, last = 0;
  for (int step = 0; step < steps; ++step) {
    const auto batch = sampler.next();
    auto loss = opt.step([&] {
      opt.zero_grad();
      const auto out = model->forward(batch.inputs);
      auto l = moe_lm::lm_loss(out.logits.to(torch::kFloat), batch.targets) + 0.01 * out.balance_loss.to(torch::kFloat);
      l.backward();
      return l;
    });
    if (step < window) first += loss.item<double>() / window;
    if (step >= steps - window) last += loss.item<double>() / window;
  }
  return {first, last};
}

}  // namespace

TEST_CASE("a short training run's loss decreases (fp32)") {
  const auto [first, last] = train(torch::kFloat, 60, 5);
  INFO("first " << first << ", last " << last);
  CHECK(last < first - 1.0);
}

TEST_CASE("a short training run's loss decreases (bf16 parameters)") {
  const auto [first, last] = train(torch::kBFloat16, 60, 5);
  INFO("first " << first << ", last " << last);
  CHECK(last < first - 1.0);
}

}  // namespace test_training
