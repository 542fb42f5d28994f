// Momentum stored in fewer bits (policies/stored_momentum.hpp): Bf16Momentum,
// Float8BlockMomentum and Int8BlockMomentum, in the blocks of state_layout.hpp.
//   - the same bits for 1, 2 and 3 threads, and on every CPU architecture
//     (the parameters within rounding), with blocks that span rows, row
//     blocks cut at block boundaries, banks whose matrices end inside a
//     block, element-wise chunks;
//   - every stored value is one of the two neighbours of m' that the
//     encoding allows, from the stored values of the step before;
//   - the decoded momentum against the fp32 recursion on the same gradients,
//     within the bound the policy states, and unbiased;
//   - bytes as the layout counts them, and the planner's figures;
//   - a checkpoint resumes bit-exactly and records the rule; an optimizer
//     with fp32 momentum refuses it and changes nothing;
//   - the sharded placement at 1 and 3 ranks (threads of this process) keeps
//     the same momentum bits as one process, and its checkpoint resumes in
//     one process;
//   - an import of the wrong size is refused with a clear error.

#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include <skewadam/checkpoint.hpp>
#include <skewadam/dist/sharded_optimizer.hpp>
#include <skewadam/comm/thread_communicator.hpp>
#include <skewadam/plan.hpp>
#include <skewadam/skewadam.hpp>

#include "../support/checkpoint_version.hpp"
#include "cpu_archs.hpp"
#include "stored_momentum_fixture.hpp"
#include "thread_ranks.hpp"

namespace test_stored_momentum {

namespace {

using namespace skewadam;

using namespace skewadam::test::stored;

}  // namespace

TEST_CASE_TEMPLATE("stored momentum: the same bits for 1, 2 and 3 threads", P, Bf16Momentum, Float8BlockMomentum,
                   Int8BlockMomentum) {
  auto one = local<AllStored<P>>(1);
  one->steps(0, 3);
  for (int threads : {2, 3}) {
    CAPTURE(threads);
    auto other = local<AllStored<P>>(threads);
    other->steps(0, 3);
    check_same(one->result(), other->result());
  }
}

TEST_CASE_TEMPLATE_DEFINE("stored momentum: every CPU architecture stores the scalar code's bits", Arch,
                          stored_every_arch) {
  // The momentum's products are rounded on their own (vmath::mul_rn), so
  // every architecture forms the same m' and stores the same values. The
  // parameters agree to rounding only: the second-moment statistics are
  // summed in another order on vector lanes.
  CAPTURE(backend::CpuBackend<Arch>::arch_name());
  auto check = [&]<class P>() {
    auto scalar = local<AllStored<P>, backend::CpuBackend<ScalarArch>>(2);
    scalar->steps(0, 3);
    auto simd = local<AllStored<P>, backend::CpuBackend<Arch>>(2);
    simd->steps(0, 3);
    check_same(scalar->result(), simd->result(), false);
    const auto sp = specs();
    for (std::size_t k = 0; k < sp.size(); ++k) {
      CAPTURE(sp[k].name);
      CHECK(params_agree(scalar->ts[k], simd->ts[k], 3, static_cast<float>(hyper().lr)));
    }
  };
  check.template operator()<Bf16Momentum>();
  check.template operator()<Float8BlockMomentum>();
  check.template operator()<Int8BlockMomentum>();
}
TEST_CASE_TEMPLATE_APPLY(stored_every_arch, skewadam::test::SimdArchs);

TEST_CASE_TEMPLATE("stored momentum: every stored value is one of the two its encoding allows", P, Bf16Momentum,
                   Float8BlockMomentum, Int8BlockMomentum) {
  // From the stored values of the step before, m' = beta1 m + (1 - beta1) g
  // with each product rounded alone; then bf16 stores one of the two bf16
  // values next to m', and the 8-bit maps each block's scale and, for each
  // element, one of the two codes next to m' (below).
  auto run = local<AllStored<P>>(2);
  const auto sp = specs();
  std::vector<std::vector<float>> before(sp.size());
  for (std::size_t k = 0; k < sp.size(); ++k) before[k].assign(static_cast<std::size_t>(sp[k].shape.numel()), 0.0f);
  for (int step = 0; step < 3; ++step) {
    run->steps(step, step + 1);
    const Result r = run->result();
    const StepScalars s = make_step_scalars(hyper(), step + 1);
    for (std::size_t k = 0; k < sp.size(); ++k) {
      CAPTURE(sp[k].name);
      CAPTURE(step);
      const Decoded<P> now = decode<P>(r.m[k], sp[k].shape);
      const MatrixGeometry g = sp[k].shape.matrices();
      const auto n = static_cast<std::size_t>(g.numel());
      std::vector<float> mp(n);
      for (std::size_t i = 0; i < n; ++i) mp[i] = P::update(before[k][i], run->ts[k].g[i], s);
      bool allowed = true;
      if constexpr (P::storage == MomentumStorage::bfloat16) {
        for (std::size_t i = 0; i < n; ++i) {
          const auto [lo, hi] = bf16_neighbours(mp[i]);
          allowed = allowed && (now.value[i] == lo || now.value[i] == hi);
        }
      } else {
        // each block: its scale from its largest |m'|; float8, each byte the
        // code below |m'| 2^-k (random bits 0) or the one above it; int8, a
        // code within one of m' * 127 / max|m'|
        const auto mat = static_cast<std::size_t>(g.matrix_size());
        for (std::size_t b0 = 0; b0 < n; b0 += mat)
          for (std::size_t s0 = 0; s0 < mat; s0 += momentum_block) {
            const std::size_t e0 = b0 + s0, e1 = b0 + std::min(mat, s0 + momentum_block);
            float amax = 0.0f;
            for (std::size_t i = e0; i < e1; ++i) amax = std::max(amax, std::fabs(mp[i]));
            const float inv = P::inverse(amax);
            for (std::size_t i = e0; i < e1; ++i) {
              const std::uint32_t c = now.code[i];
              allowed = allowed && now.value[i] == P::decode(c, P::scale(amax));
              if constexpr (P::storage == MomentumStorage::float8_blocks) {
                const std::uint32_t down = P::code_one(mp[i], inv, 0u);
                const bool up =
                    (c & 0x7fu) == (down & 0x7fu) + 1u && (c & 0x80u) == ((mp[i] < 0.0f ? 0x80u : 0u));
                allowed = allowed && (c == down || up) && (c & 0x7fu) < 127u;
              } else {
                const auto q = static_cast<float>(static_cast<std::int8_t>(c));
                const float lo = std::floor(vmath::mul_rn(mp[i], inv));
                allowed = allowed && (q == lo || q == lo + 1.0f) && std::fabs(q) <= 127.0f;
              }
            }
          }
      }
      CHECK(allowed);
      before[k] = now.value;
    }
  }
}

TEST_CASE_TEMPLATE("stored momentum: within the stated bound of the fp32 recursion, and unbiased", P, Bf16Momentum,
                   Float8BlockMomentum, Int8BlockMomentum) {
  // m32 is what fp32 momentum holds on the same gradients. Each step's
  // rounding moves an element by less than its step (int8: the block's
  // scale s_t; float8: the spacing of the codes around it; bf16: one bf16
  // spacing, at most 2^-7 |m'|); after T steps the
  // error is at most the sum of beta1^(T - t) times those, plus fp32 rounding.
  auto run = local<AllStored<P>>(2);
  const float beta1 = static_cast<float>(hyper().beta1);
  const auto sp = specs();
  std::vector<std::vector<float>> m32(sp.size()), bound(sp.size());
  for (std::size_t k = 0; k < sp.size(); ++k) {
    m32[k].assign(static_cast<std::size_t>(sp[k].shape.numel()), 0.0f);
    bound[k].assign(m32[k].size(), 0.0f);
  }
  double error_sum = 0, count = 0, step_sum = 0;
  for (int step = 0; step < 6; ++step) {
    run->steps(step, step + 1);
    const Result r = run->result();
    for (std::size_t k = 0; k < sp.size(); ++k) {
      CAPTURE(sp[k].name);
      CAPTURE(step);
      const Decoded<P> m = decode<P>(r.m[k], sp[k].shape);
      bool within = true;
      for (std::size_t i = 0; i < m.value.size(); ++i) {
        m32[k][i] = beta1 * m32[k][i] + (1.0f - beta1) * run->ts[k].g[i];
        const float unit = P::storage == MomentumStorage::bfloat16 ? 0x1p-7f * std::fabs(m.value[i]) : m.step[i];
        bound[k][i] = beta1 * bound[k][i] + unit * (1.0f + 0x1p-7f);
        const float err = m.value[i] - m32[k][i];
        within = within && std::fabs(err) <= bound[k][i] * 1.0001f + 1e-6f * std::fabs(m32[k][i]);
        error_sum += err;
        count += 1;
        step_sum += unit;
      }
      CHECK(within);
    }
  }
  // Unbiased: the mean error over about 2.9 million element-steps is far
  // below the mean step (a biased rounding, such as truncation, would put it
  // near half a step).
  CHECK(std::fabs(error_sum / count) < 0.01 * step_sum / count);
}

TEST_CASE("8-bit momentum: a block of zeros stores zeros; the codes are not all equal") {
  auto run = local<AllStored<Int8BlockMomentum>>(1);
  run->steps(0, 1);
  const Result r = run->result();
  // backbone.w's row 3 has zero gradients but its blocks span other rows;
  // backbone.small (7 x 5) is one block whose row 3 is zero.
  const Decoded<Int8BlockMomentum> m = decode<Int8BlockMomentum>(r.m[3], specs()[3].shape);
  for (index_t j = 0; j < 5; ++j) CHECK(m.value[static_cast<std::size_t>(3 * 5 + j)] == 0.0f);
  const std::vector<float>& w = r.m[0];
  const auto* bytes = reinterpret_cast<const std::int8_t*>(w.data());
  int distinct = 0;
  for (int c = -127; c <= 127; ++c)
    distinct += std::any_of(bytes, bytes + 4 * w.size(), [&](std::int8_t q) { return q == c; }) ? 1 : 0;
  CHECK(distinct > 100);
}

TEST_CASE("stored momentum: state bytes are the layout's, and the planner's") {
  auto run8 = local<SkewAdam8bitTiers>(1);
  auto run16 = local<SkewAdamBf16Tiers>(1);
  auto run32 = local<SkewAdamTiers>(1);
  index_t b8 = 0, b16 = 0;
  for (const Spec& s : specs()) {
    if (s.tier != Tier::backbone) continue;
    const MatrixGeometry g = s.shape.matrices();
    const index_t second = second_moment_bytes(SkewAdamTiers::layout(Tier::backbone), s.shape);
    index_t words8 = 0;
    for (index_t e = 0; e < g.matrix_size(); e += 256) words8 += 1 + (std::min<index_t>(256, g.matrix_size() - e) + 3) / 4;
    b8 += 4 * g.batch * words8 + second;
    b16 += 4 * g.batch * ((g.matrix_size() + 1) / 2) + second;
  }
  CHECK(run8->opt->state_bytes(Tier::backbone) == b8);
  CHECK(run16->opt->state_bytes(Tier::backbone) == b16);
  CHECK(SkewAdam8bitTiers::layout(Tier::backbone).storage == MomentumStorage::float8_blocks);
  CHECK(SkewAdamLinear8bitTiers::layout(Tier::backbone).storage == MomentumStorage::int8_blocks);
  CHECK(momentum_bytes(SkewAdamLinear8bitTiers::layout(Tier::backbone), Shape{4096, 4096}) ==
        momentum_bytes(SkewAdam8bitTiers::layout(Tier::backbone), Shape{4096, 4096}));
  CHECK(SkewAdamBf16Tiers::layout(Tier::backbone).storage == MomentumStorage::bfloat16);
  const StateLayout l8 = SkewAdam8bitTiers::layout(Tier::backbone);
  const StateLayout l16 = SkewAdamBf16Tiers::layout(Tier::backbone);
  // a 4096 x 4096 matrix: 65,536 blocks of 256 codes and a scale; bf16 half of fp32
  CHECK(momentum_bytes(l8, Shape{4096, 4096}) == 4096 * 4096 + 4 * 4096 * 4096 / 256);
  CHECK(momentum_bytes(l16, Shape{4096, 4096}) == 2 * 4096 * 4096);
  CHECK(momentum_bytes(SkewAdamTiers::layout(Tier::backbone), Shape{4096, 4096}) == 4 * 4096 * 4096);
  CHECK(momentum_bytes(l8, Shape{7, 5}) == 4 * (1 + 9));
  CHECK(momentum_bytes(l16, Shape{7, 5}) == 4 * 18);
  CHECK(momentum_bytes(l8, Shape{3, 7, 5}) == 3 * 4 * (1 + 9));  // each matrix's blocks are its own
  // the experts' and the router's state are SkewAdam's
  for (Tier t : {Tier::experts, Tier::router}) {
    CHECK(run8->opt->state_bytes(t) == run32->opt->state_bytes(t));
    CHECK(run16->opt->state_bytes(t) == run32->opt->state_bytes(t));
  }
  CHECK(run8->opt->state_bytes(Tier::backbone) < run32->opt->state_bytes(Tier::backbone) / 3);
  // the planner counts the same bytes for the same tensors
  std::vector<TensorSpec> inventory;
  std::vector<Tier> tiers;
  for (const Spec& s : specs()) {
    inventory.push_back(TensorSpec{s.name, s.shape, s.param});
    tiers.push_back(s.tier);
  }
  const Plan plan = make_plan(inventory, tiers);
  CHECK(plan.state_bytes.skewadam_8bit == run8->opt->state_bytes());
  CHECK(plan.state_bytes.skewadam_bf16 == run16->opt->state_bytes());
}

TEST_CASE_TEMPLATE("stored momentum: a checkpoint resumes bit-exactly and names the rule", P, Bf16Momentum,
                   Float8BlockMomentum, Int8BlockMomentum) {
  using Tiers = AllStored<P>;
  auto whole = local<Tiers>(2);
  whole->steps(0, 4);

  auto first = local<Tiers>(2);
  first->steps(0, 2);
  const std::vector<std::byte> bytes = checkpoint_bytes(*first->opt, SaveOptions{.include_params = true});
  const CheckpointInfo info = read_checkpoint_info(std::span<const std::byte>(bytes));
  CHECK(info.tiers[0].rule == rule_name<typename Tiers::backbone>());
  CHECK(info.tiers[0].rule.find(std::string(policy_name<P>::value)) != std::string::npos);
  CHECK(info.tiers[0].layout == Tiers::layout(Tier::backbone));

  auto resumed = local<Tiers>(3);  // another thread count
  load_checkpoint(*resumed->opt, std::span<const std::byte>(bytes), LoadOptions{.params = ParamValues::require});
  for (std::size_t k = 0; k < resumed->ts.size(); ++k) {  // the parameters come back with the state
    CAPTURE(resumed->ts[k].spec.name);
    CHECK(resumed->ts[k].bytes() == first->ts[k].bytes());
  }
  resumed->steps(2, 4);
  check_same(whole->result(), resumed->result());

  // The same records as format version 1: the momentum codes 2 and 3 (linear
  // int8, bf16) read as they did; code 4 (float8) is version 2's, corrupt in
  // a version 1 file.
  const std::vector<std::byte> v1 = test::with_format_version(bytes, 1);
  auto old = local<Tiers>(1);
  if constexpr (P::storage != MomentumStorage::float8_blocks) {
    load_checkpoint(*old->opt, std::span<const std::byte>(v1), LoadOptions{.params = ParamValues::require});
    old->steps(2, 4);
    check_same(whole->result(), old->result());
  } else {
    const Result fresh = old->result();
    CHECK_THROWS_WITH_AS(load_checkpoint(*old->opt, std::span<const std::byte>(v1)),
                         doctest::Contains("malformed state layout"), CheckpointError);
    check_same(fresh, old->result());
  }

  // fp32 momentum reads m differently: refused, nothing changed
  auto other = local<SkewAdamTiers>(1);
  other->steps(0, 1);
  const Result before = other->result();
  try {
    load_checkpoint(*other->opt, std::span<const std::byte>(bytes));
    FAIL("a stored-momentum checkpoint loaded into fp32 momentum");
  } catch (const CheckpointError& e) {
    CHECK(e.kind() == CheckpointError::Kind::mismatch);
    CHECK(std::string(e.what()).find(std::string(policy_name<P>::value)) != std::string::npos);
  }
  check_same(before, other->result());
}

TEST_CASE_TEMPLATE("stored momentum: sharded at 1 and 3 ranks keeps one process's momentum bits", P, Bf16Momentum,
                   Float8BlockMomentum, Int8BlockMomentum) {
  // Matrices cut between ranks add their column statistics in another order
  // than one process, so the parameters agree to rounding; the momentum is
  // a function of the gradients alone and keeps one process's bits, and so
  // does a checkpoint written by the 3 ranks, resumed in one process.
  using Tiers = AllStored<P>;
  using Sharded1 = Run<dist::ShardedOptimizer<Tiers, dist::SelfCommunicator>>;
  using Sharded3 = Run<dist::ShardedOptimizer<Tiers, dist::ThreadCommunicator>>;
  auto single = local<Tiers>(1);
  single->steps(0, 3);
  const Result want = single->result();

  dist::SelfCommunicator self;
  Sharded1 one(self, hyper(), OptimizerOptions{.seed = 42, .threads = 1});
  one.steps(0, 3);
  check_same(want, one.result());

  std::vector<Result> results(3);
  std::vector<std::vector<std::byte>> checkpoints(3);
  std::vector<index_t> cut_tensors(3, 0);
  test::run_ranks(3, [&](dist::ThreadCommunicator comm, int r) {
    Sharded3 run(comm, hyper(), OptimizerOptions{.seed = 42, .threads = 1});
    run.steps(0, 3);
    run.opt->gather_params();
    results[static_cast<std::size_t>(r)] = run.result();
    checkpoints[static_cast<std::size_t>(r)] = checkpoint_bytes(*run.opt);
    for (std::size_t k = 0; k < run.ids.size(); ++k)
      cut_tensors[static_cast<std::size_t>(r)] += run.opt->split(run.ids[k]).cuts_matrices() ? 1 : 0;
  });
  // every backbone and router tensor is cut in row slices or element ranges
  // (backbone.small's one block at rank 2 alone, 7 x 5 holding less than a
  // block); the bank is dealt out by whole experts
  CHECK(cut_tensors[0] == 5);
  const auto sp = specs();
  for (int r = 0; r < 3; ++r) {
    CAPTURE(r);
    check_same(want, results[static_cast<std::size_t>(r)], false);
    for (std::size_t k = 0; k < sp.size(); ++k) {
      CAPTURE(sp[k].name);
      CHECK(results[static_cast<std::size_t>(r)].params[k] == results[0].params[k]);  // every rank has them all
      const Tensor b = Tensor::of(sp[k], results[static_cast<std::size_t>(r)].params[k]);
      CHECK(params_agree(single->ts[k], b, 3, static_cast<float>(hyper().lr)));
    }
  }
  CHECK(!checkpoints[0].empty());  // written by rank 0 alone
  CHECK(checkpoints[1].empty());
  // the 3 ranks' checkpoint, resumed in one process, steps as one process does
  auto resumed = local<Tiers>(1);
  load_checkpoint(*resumed->opt, std::span<const std::byte>(checkpoints[0]));
  check_same(want, resumed->result(), false);
  resumed->steps(3, 4);
  single->steps(3, 4);
  check_same(single->result(), resumed->result(), false);
}

TEST_CASE_TEMPLATE("stored momentum: decode_momentum reads the words as this test's own decoder does", P,
                   Bf16Momentum, Float8BlockMomentum, Int8BlockMomentum) {
  auto run = local<AllStored<P>>(1);
  run->steps(0, 2);
  const Result r = run->result();
  const auto sp = specs();
  for (std::size_t k = 0; k < sp.size(); ++k) {
    CAPTURE(sp[k].name);
    const std::vector<float> got = decode_momentum(P::storage, sp[k].shape.matrices(), r.m[k]);
    CHECK(same_bits(got, decode<P>(r.m[k], sp[k].shape).value));
  }
  std::vector<float> short_words(r.m[0].begin(), r.m[0].end() - 1);
  CHECK_THROWS_WITH_AS(decode_momentum(P::storage, sp[0].shape.matrices(), short_words),
                       doctest::Contains("words, expected"), std::invalid_argument);
  // fp32 momentum is its own values
  const std::vector<float> plain{1.0f, -2.0f, 3.0f};
  CHECK(same_bits(decode_momentum(MomentumStorage::f32, MatrixGeometry{1, 1, 3}, plain), plain));
}

TEST_CASE("stored momentum: an import of the wrong size is refused, naming the array") {
  auto run = local<SkewAdam8bitTiers>(1);
  run->steps(0, 1);
  const Result before = run->result();
  OptimizerState state = run->opt->export_state();
  REQUIRE(!state.params.empty());
  state.params[0].state.m.resize(static_cast<std::size_t>(specs()[0].shape.numel()));  // fp32's size
  try {
    run->opt->import_state(state);
    FAIL("import of an fp32-sized m accepted");
  } catch (const std::invalid_argument& e) {
    CHECK(std::string(e.what()).find("m has") != std::string::npos);
  }
  check_same(before, run->result());
}

}  // namespace test_stored_momentum
