// The ShardedOptimizer in one process (SelfCommunicator; the MPI tests run it
// over 2-4 ranks): bit-identical to the single-process Optimizer, its shard
// plan, and bad input rejected with nothing changed.

#include <doctest/doctest.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <random>
#include <string>
#include <vector>

#include <skewadam/checkpoint.hpp>
#include <skewadam/dist/sharded_optimizer.hpp>
#include <skewadam/comm/thread_communicator.hpp>
#include <skewadam/skewadam.hpp>

#include "thread_ranks.hpp"

namespace test_sharded {

using namespace skewadam;

namespace {

struct Model {
  std::vector<float> embed = std::vector<float>(600 * 1024);  // cut into row blocks in one process
  std::vector<bf16> attn = std::vector<bf16>(40 * 24);
  std::vector<float> norm = std::vector<float>(24);
  std::vector<bf16> bank = std::vector<bf16>(6 * 12 * 10);
  std::vector<float> router = std::vector<float>(6 * 24);
  std::vector<float> g_embed = std::vector<float>(embed.size());
  std::vector<bf16> g_attn = std::vector<bf16>(attn.size());
  std::vector<float> g_norm = std::vector<float>(norm.size());
  std::vector<bf16> g_bank = std::vector<bf16>(bank.size());
  std::vector<float> g_router = std::vector<float>(router.size());

  Model() {
    std::mt19937 gen(3);
    std::normal_distribution<float> d(0.0f, 0.1f);
    for (auto& x : embed) x = d(gen);
    for (auto& x : attn) x = bf16(d(gen));
    for (auto& x : norm) x = d(gen);
    for (auto& x : bank) x = bf16(d(gen));
    for (auto& x : router) x = d(gen);
  }
  void grads(int step) {
    std::mt19937 gen(static_cast<std::uint32_t>(step));
    std::normal_distribution<float> d(0.0f, step % 2 ? 2.0f : 0.01f);
    for (auto& x : g_embed) x = d(gen);
    for (auto& x : g_attn) x = bf16(d(gen));
    for (auto& x : g_norm) x = d(gen);
    for (auto& x : g_bank) x = bf16(d(gen));
    for (auto& x : g_router) x = d(gen);
  }
  template <class Opt>
  void add_to(Opt& opt) {
    opt.add("embed", Tier::backbone, TensorView<float>(embed.data(), {600, 1024}),
            TensorView<const float>(g_embed.data(), {600, 1024}));
    opt.add("attn", Tier::backbone, TensorView<bf16>(attn.data(), {40, 24}),
            TensorView<const bf16>(g_attn.data(), {40, 24}));
    opt.add("norm", Tier::backbone, TensorView<float>(norm.data(), {24}), TensorView<const float>(g_norm.data(), {24}));
    opt.add("bank", Tier::experts, TensorView<bf16>(bank.data(), {6, 12, 10}),
            TensorView<const bf16>(g_bank.data(), {6, 12, 10}));
    opt.add("router", Tier::router, TensorView<float>(router.data(), {6, 24}),
            TensorView<const float>(g_router.data(), {6, 24}));
  }
};

template <class T>
bool same_bits(const std::vector<T>& a, const std::vector<T>& b) {
  return a.size() == b.size() && (a.empty() || std::memcmp(a.data(), b.data(), a.size() * sizeof(T)) == 0);
}

PerTier<Hyperparameters> hyper() {
  PerTier<Hyperparameters> h;
  h.backbone = {.lr = 1e-2, .weight_decay = 0.05};
  h.experts = {.lr = 1e-2, .weight_decay = 0.05};
  h.router = {.lr = 1e-2};
  return h;
}

}  // namespace

TEST_CASE("one rank: the sharded optimizer gives the single-process bits") {
  Model a, b;
  SkewAdam single(hyper(), OptimizerOptions{.threads = 2});
  a.add_to(single);
  dist::SelfCommunicator self;
  dist::ShardedOptimizer<SkewAdamTiers, dist::SelfCommunicator> sharded(self, hyper(), OptimizerOptions{.threads = 2});
  CHECK(sharded.threads() == 2);
  b.add_to(sharded);
  for (int s = 1; s <= 4; ++s) {
    a.grads(s);
    b.grads(s);
    single.step();
    REQUIRE(single.last_step().applied);
    sharded.step();
    REQUIRE(sharded.last_step().applied);
  }
  CHECK(same_bits(a.embed, b.embed));
  CHECK(same_bits(a.attn, b.attn));
  CHECK(same_bits(a.norm, b.norm));
  CHECK(same_bits(a.bank, b.bank));
  CHECK(same_bits(a.router, b.router));
  const OptimizerState sa = single.export_state();
  const OptimizerState sb = sharded.export_state();
  REQUIRE(sa.params.size() == sb.params.size());
  for (std::size_t i = 0; i < sa.params.size(); ++i) {
    CHECK(same_bits(sa.params[i].state.m, sb.params[i].state.m));
    CHECK(same_bits(sa.params[i].state.v, sb.params[i].state.v));
    CHECK(same_bits(sa.params[i].state.v_row, sb.params[i].state.v_row));
    CHECK(same_bits(sa.params[i].state.v_col, sb.params[i].state.v_col));
  }
  CHECK(sharded.state_bytes() == single.state_bytes());
  CHECK(sharded.state_bytes(Tier::experts) == single.state_bytes(Tier::experts));
  CHECK(sharded.state_bytes_per_rank() == std::vector<index_t>{single.state_bytes()});
  // nothing is cut with one rank: only the 32-byte agreement check
  CHECK(sharded.last_step_exchange_bytes() == 32);
}

TEST_CASE_TEMPLATE("three ranks in one process: the step inside backward gives the whole step's bits", Tiers,
                   SkewAdamTiers, SkewAdam8bitTiers, AdamWTiers) {
  // Each rank a thread (dist::ThreadGroup): the embedding, the attention
  // matrix, the norm and the router are cut between the ranks, so stepping
  // one of them inside backward exchanges its column sums (or clip sums)
  // there and then, one tensor at a time; the bank is dealt out by experts.
  using Sharded = dist::ShardedOptimizer<Tiers, dist::ThreadCommunicator>;
  std::vector<std::vector<std::vector<unsigned char>>> whole(3), inside(3);
  std::vector<OptimizerState> whole_state(3), inside_state(3);
  std::vector<index_t> exchanged(3, 0);
  auto bytes = [](const Model& m) {
    std::vector<std::vector<unsigned char>> out;
    auto add = [&](const auto& v) {
      out.emplace_back(reinterpret_cast<const unsigned char*>(v.data()),
                       reinterpret_cast<const unsigned char*>(v.data() + v.size()));
    };
    add(m.embed), add(m.attn), add(m.norm), add(m.bank), add(m.router);
    return out;
  };
  test::run_ranks(3, [&](dist::ThreadCommunicator comm, int r) {
    const auto k = static_cast<std::size_t>(r);
    Model a, b;
    Sharded one(comm, hyper(), OptimizerOptions{.threads = 1});
    a.add_to(one);
    Sharded two(comm, hyper(), OptimizerOptions{.threads = 1});
    b.add_to(two);
    const index_t n = two.size();
    for (int s = 1; s <= 3; ++s) {
      a.grads(s);
      b.grads(s);
      one.step();
      for (index_t i = n; i-- > 0;) two.step(ParamId{i});  // backward's order: the last registered first
      const StepReport report = two.finish_step();
      REQUIRE(report.applied);
      exchanged[k] += two.last_step_exchange_bytes();
    }
    one.gather_params();
    two.gather_params();
    whole[k] = bytes(a);
    inside[k] = bytes(b);
    whole_state[k] = one.export_state();
    inside_state[k] = two.export_state();
  });
  for (std::size_t k = 0; k < 3; ++k) {
    CAPTURE(k);
    CHECK(whole[k] == inside[k]);
    CHECK(whole[k] == whole[0]);  // every rank holds every parameter once gathered
    for (std::size_t i = 0; i < whole_state[k].params.size(); ++i) {
      const ParamState& x = whole_state[k].params[i].state;
      const ParamState& y = inside_state[k].params[i].state;
      CHECK(same_bits(x.m, y.m));
      CHECK(same_bits(x.v, y.v));
      CHECK(same_bits(x.v_row, y.v_row));
      CHECK(same_bits(x.v_col, y.v_col));
    }
    CHECK(exchanged[k] > 0);
  }
}

TEST_CASE("shard plan: rows, whole experts, whole tensors") {
  dist::TensorSplit rows{MatrixGeometry{1, 10, 4}, true, dist::Split::rows, 0, 3};
  CHECK(rows.pieces(0).size() == 1);
  CHECK(rows.pieces(0)[0].begin == 0);
  CHECK(rows.pieces(0)[0].end == 3);
  CHECK(rows.pieces(2)[0].begin == 6);
  CHECK(rows.pieces(2)[0].end == 10);
  CHECK(rows.cuts_matrices());
  CHECK(rows.first_element(rows.pieces(1)[0]) == 3 * 4);

  dist::TensorSplit one_row{MatrixGeometry{1, 1, 33}, true, dist::Split::rows, 0, 4};
  int owners = 0;
  for (int r = 0; r < 4; ++r) owners += one_row.pieces(r).empty() ? 0 : 1;
  CHECK(owners == 1);
  CHECK(one_row.first_owner(0) == 3);

  dist::TensorSplit bank{MatrixGeometry{5, 12, 10}, true, dist::Split::matrices, 0, 2};
  CHECK(bank.pieces(0).size() == 2);
  CHECK(bank.pieces(1).size() == 3);
  CHECK(bank.pieces(1)[0].matrix == 2);
  CHECK(!bank.cuts_matrices());
  CHECK(dist::exchange_bytes(bank, true, true).clip == 0);    // per-matrix clip: nothing to sum
  CHECK(dist::exchange_bytes(bank, true, false).clip == 40);  // whole-bank clip: a double per expert
  CHECK(dist::exchange_bytes(bank, true, false).statistics == 0);

  dist::TensorSplit elementwise{MatrixGeometry{1, 6, 24}, false, dist::Split::rows, 0, 4};
  index_t total = 0;
  for (int r = 0; r < 4; ++r)
    for (const dist::Piece& p : elementwise.pieces(r)) total += elementwise.elements(p);
  CHECK(total == 144);
  CHECK(dist::exchange_bytes(elementwise, true, false).statistics == 0);
  CHECK(dist::exchange_bytes(elementwise, true, false).clip == 8);
}

TEST_CASE("sharded optimizer: bad input names the argument and changes nothing") {
  Model m;
  dist::SelfCommunicator self;
  dist::ShardedOptimizer<SkewAdamTiers, dist::SelfCommunicator> opt(self, hyper());
  m.add_to(opt);
  m.grads(1);
  opt.step();
  const OptimizerState before = opt.export_state();

  CHECK_THROWS_WITH_AS(opt.add("embed", Tier::backbone, TensorView<float>(m.embed.data(), {600, 1024})),
                       doctest::Contains("name: parameter 'embed' is already registered"), std::invalid_argument);
  OptimizerState wrong = before;
  wrong.params[1].state.v_row.pop_back();
  CHECK_THROWS_WITH_AS(opt.import_state(wrong), doctest::Contains("state of 'attn': v_row has 39 values, expected 40"),
                       std::invalid_argument);
  wrong = before;
  wrong.params.pop_back();
  CHECK_THROWS_WITH_AS(opt.import_state(wrong), doctest::Contains("state: holds 4 parameters"), std::invalid_argument);
  const OptimizerState after = opt.export_state();
  for (std::size_t i = 0; i < before.params.size(); ++i) {
    CHECK(same_bits(before.params[i].state.v_row, after.params[i].state.v_row));
    CHECK(same_bits(before.params[i].state.m, after.params[i].state.m));
  }
  using OnOneRank = dist::ShardedOptimizer<SkewAdamTiers, dist::SelfCommunicator>;
  const auto bad_sharding = [&] {
    OnOneRank o(self, hyper(), OptimizerOptions{}, dist::ShardOptions{static_cast<dist::ExpertSharding>(7)});
  };
  CHECK_THROWS_WITH_AS(bad_sharding(), doctest::Contains("shard.experts"), std::invalid_argument);
  CHECK_THROWS_WITH_AS(opt.set_threads(-1), doctest::Contains("threads = -1"), std::invalid_argument);

  // a NaN gradient: the step is skipped, state and step count unchanged
  m.grads(2);
  m.g_router[5] = NAN;
  opt.step();
  const StepReport r = opt.last_step();
  CHECK_FALSE(r.applied);
  REQUIRE(r.nonfinite);
  CHECK(r.nonfinite->name == "router");
  CHECK(r.nonfinite->element == 5);
  CHECK(opt.steps() == 1);
  const OptimizerState skipped = opt.export_state();
  for (std::size_t i = 0; i < before.params.size(); ++i) CHECK(same_bits(before.params[i].state.v, skipped.params[i].state.v));
}

TEST_CASE("sharded checkpoint: a save that cannot be written raises an I/O error and writes nothing") {
  Model m;
  dist::SelfCommunicator self;
  dist::ShardedOptimizer<SkewAdamTiers, dist::SelfCommunicator> opt(self, hyper());
  m.add_to(opt);
  m.grads(1);
  opt.step();
  REQUIRE(opt.last_step().applied);
  const std::filesystem::path dir = std::filesystem::temp_directory_path() / "skewadam-sharded-save";
  std::filesystem::create_directories(dir);
  const std::filesystem::path file = dir / "opt.ckpt";
  save_checkpoint(opt, file);
  const auto saved_size = std::filesystem::file_size(file);
  const CheckpointInfo saved = read_checkpoint_info(file);
  CHECK(saved.steps == 1);

  // a folder that does not exist: raised on every rank (here: the one), as an I/O error
  const std::filesystem::path nowhere = dir / "no-such-folder" / "opt.ckpt";
  CHECK_THROWS_WITH_AS(save_checkpoint(opt, nowhere), doctest::Contains("rank 0: "), CheckpointError);
  CHECK_FALSE(std::filesystem::exists(nowhere));

  // the file saved before loads, and takes the optimizer back to its step
  m.grads(2);
  opt.step();
  REQUIRE(opt.last_step().applied);
  CHECK(std::filesystem::file_size(file) == saved_size);
  load_checkpoint(opt, file);
  CHECK(opt.steps() == 1);
}

}  // namespace test_sharded
