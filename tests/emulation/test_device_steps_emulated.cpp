// Steps counted on the device (the CUDA backend, engine/backend/cuda/cuda_backend.hpp,
// over the emulated runtime): step() waits for nothing, counts and reports
// are read when asked, and a step captured as a graph replays exactly as
// ordinary steps do, skips and clipping included; what a graph cannot do is
// refused with nothing changed.

#include <doctest/doctest.h>

#include <skewadam_tools/emulated_runtime.hpp>

#include <cmath>
#include <limits>
#include <optional>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <vector>

#include <skewadam/skewadam.hpp>

#include "training_fixture.hpp"

namespace test_device_steps_emulated {

namespace {

using namespace skewadam;
using Emulated = Optimizer<SkewAdamTiers, tools::EmulatedCuda>;

PerTier<Hyperparameters> hyper() { return fixture::tier_hyper(); }

/// Any stream but the default one (the emulated runtime ignores its value).
void* const a_stream = reinterpret_cast<void*>(std::uintptr_t{0x51});

/// Every tensor gets a gradient (the same memory every step), filled for step t.
void fill(fixture::Model& m, std::int64_t t) {
  for (std::size_t i = 0; i < m.tensors.size(); ++i) m.tensors[i].fill_grad(i + 1, t);
}
template <class Opt>
void set_all(fixture::Model& m, Opt& opt, const std::vector<ParamId>& ids) {
  for (std::size_t i = 0; i < m.tensors.size(); ++i) opt.set_grad(ids[i], m.tensors[i].grad());
}
void poke(fixture::Tensor& t, std::size_t at, float value) {
  if (!t.g32.empty()) t.g32[at] = value;
  if (!t.gb.empty()) t.gb[at] = bf16(value);
  if (!t.gh.empty()) t.gh[at] = f16(value);
}

}  // namespace

/// The call throws std::invalid_argument whose message contains `words`.
#define REFUSED(call, words) \
  CHECK_THROWS_WITH_AS(call, doctest::Contains(std::string(words).c_str()), std::invalid_argument)

TEST_CASE("device counts: step() waits for nothing, counts and the report are read when asked") {
  for (NonFinitePolicy policy : {NonFinitePolicy::skip_step, NonFinitePolicy::unchecked})
  for (double max_norm : {0.0, 0.5}) {  // max_grad_norm: clipped on the device
    INFO("policy ", nonfinite_policy_name(policy), ", max_grad_norm ", max_norm);
    fixture::Model m = fixture::Model::make(Dtype::bf16);
    Emulated opt(hyper(), {.seed = 7, .nonfinite = policy, .max_grad_norm = max_norm});
    const auto ids = m.register_with(opt);
    set_all(m, opt, ids);
    fill(m, 1);
    opt.step();  // the first step uploads the tables
    const long waits = emu::Runtime::waits();
    for (std::int64_t t = 2; t <= 4; ++t) {
      fill(m, t);
      opt.step();
    }
    opt.set_lr(Tier::experts, 1e-3);  // a changed hyperparameter is uploaded, not waited for
    opt.step();
    CHECK(emu::Runtime::waits() == waits);
    CHECK(opt.steps() == 5);
    CHECK(emu::Runtime::waits() > waits);
    CHECK(opt.step_count(ids[3]) == 5);
    CHECK(opt.last_step().applied);
    if (policy == NonFinitePolicy::skip_step) {
      poke(m.tensors[3], 17, std::numeric_limits<float>::quiet_NaN());
      const long before = emu::Runtime::waits();
      opt.step();
      CHECK(emu::Runtime::waits() == before);
      const StepReport& r = opt.last_step();
      CHECK_FALSE(r.applied);
      REQUIRE(r.nonfinite.has_value());
      CHECK(r.nonfinite->name == m.tensors[3].name);
      CHECK(r.nonfinite->element == 17);
      CHECK(opt.steps() == 5);
      CHECK(opt.step_count(ids[3]) == 5);
    }
  }
}

TEST_CASE("device counts: inside backward, no wait until finish_step(), which reads every verdict once") {
  // each tensor stepped alone, in backward's order, one of them non-finite:
  // nothing waits for the device until finish_step(), whose report names
  // the skipped tensor; the bits are the whole step's without that tensor.
  // (The first step sorts the tensors by their gradients' dtypes, once.)
  fixture::Model a = fixture::Model::make(Dtype::bf16, /*large=*/false), b = a;
  Emulated inside(hyper(), {.seed = 7, .stream = a_stream});
  Emulated whole(hyper(), {.seed = 7, .stream = a_stream});
  const auto ia = a.register_with(inside);
  const auto ib = b.register_with(whole);
  set_all(a, inside, ia);
  set_all(b, whole, ib);
  for (std::int64_t t = 1; t <= 4; ++t) {
    CAPTURE(t);
    fill(a, t);
    fill(b, t);
    const std::size_t bad = 2;
    const bool first = t == 1;
    if (t == 3) {
      poke(a.tensors[bad], 5, std::numeric_limits<float>::infinity());
      whole.clear_grad(ib[bad]);
    }
    long before = emu::Runtime::waits();
    for (std::size_t k = a.tensors.size(); k-- > 0;) inside.step(ia[k]);
    if (!first) CHECK(emu::Runtime::waits() == before);
    before = emu::Runtime::waits();
    const StepReport r = inside.finish_step();
    CHECK(emu::Runtime::waits() == before + 1);
    whole.step();
    if (t == 3) whole.set_grad(ib[bad], b.tensors[bad].grad());
    CHECK(r.applied == (t != 3));
    CHECK(r.skipped == (t == 3 ? 1 : 0));
    CHECK(r.stepped == static_cast<index_t>(a.tensors.size()));
    CHECK(r.not_stepped.empty());
    if (t == 3) {
      REQUIRE(r.nonfinite.has_value());
      CHECK(r.nonfinite->name == a.tensors[bad].name);
      CHECK(r.nonfinite->element == 5);
      CHECK(inside.step_count(ia[bad]) == 2);
    }
    CHECK(fixture::Snapshot::take(a, inside) == fixture::Snapshot::take(b, whole));
  }
  CHECK(inside.steps() == 4);
}

TEST_CASE("device counts: a step inside backward launches blocks for its own tensor alone") {
  // the router (element-wise, so its work does not depend on the others)
  // stepped alone launches as many blocks beside the whole model as in an
  // optimizer that holds it alone; finish_step() launches no tensor's work;
  // a whole step launches many more
  fixture::Model m = fixture::Model::make(Dtype::f32);
  const std::size_t k = m.tensors.size() - 1;
  REQUIRE(m.tensors[k].tier == Tier::router);
  Emulated all(hyper(), {.seed = 7});
  Emulated alone(hyper(), {.seed = 7});
  const auto ids = m.register_with(all);
  const ParamId one = alone.add(m.tensors[k].name, m.tensors[k].tier, m.tensors[k].param());
  fill(m, 1);
  set_all(m, all, ids);
  alone.set_grad(one, m.tensors[k].grad());
  for (int warm = 0; warm < 2; ++warm) {  // the first step of each sorts its gradients' dtypes
    all.step(ids[k]);
    (void)all.finish_step();
    alone.step(one);
    (void)alone.finish_step();
  }
  // blocks launched by f()
  auto blocks_of = [](auto&& f) {
    const long before = emu::Runtime::blocks();
    f();
    return emu::Runtime::blocks() - before;
  };
  const long in_all = blocks_of([&] { all.step(ids[k]); });
  const long by_itself = blocks_of([&] { alone.step(one); });
  const long finish = blocks_of([&] { (void)all.finish_step(); });  // counts the step: no tensor's work
  const long whole = blocks_of([&] { all.step(); });
  (void)alone.finish_step();
  CHECK(in_all == by_itself);
  // a step of the LayerNorm's 24 weights: a handful of one-block launches,
  // against the whole model's hundreds
  const std::size_t ln = 2;
  REQUIRE(m.tensors[ln].numel() == 24);
  const long small = blocks_of([&] { all.step(ids[ln]); });
  (void)all.finish_step();
  INFO("blocks: whole step ", whole, ", the router alone ", in_all, ", the LayerNorm alone ", small,
       ", finish_step() ", finish);
  CHECK(small <= 10);
  CHECK(finish <= 3);
  CHECK(whole > 20 * small);
}

TEST_CASE("device counts: a captured step replays as ordinary steps do, bit for bit") {
  fixture::Model a = fixture::Model::make(Dtype::bf16), b = a;
  Emulated stepped(hyper(), {.seed = 99, .stream = a_stream});
  Emulated replayed(hyper(), {.seed = 99, .stream = a_stream});
  const auto ia = a.register_with(stepped);
  const auto ib = b.register_with(replayed);
  set_all(a, stepped, ia);
  set_all(b, replayed, ib);
  const fixture::Snapshot fresh = fixture::Snapshot::take(b, replayed);
  const auto graph = replayed.capture_step();
  CHECK(fixture::Snapshot::take(b, replayed) == fresh);  // capturing steps nothing
  CHECK(replayed.steps() == 0);
  std::optional<std::remove_cvref_t<decltype(graph)>> clipping;

  for (std::int64_t t = 1; t <= 6; ++t) {
    CAPTURE(t);
    fill(a, t);
    fill(b, t);
    if (t == 6) {  // a graph that clips every step, against steps that do
      stepped.set_max_grad_norm(0.25);
      replayed.set_max_grad_norm(0.25);
      CHECK_THROWS_WITH_AS(replayed.replay(graph), doctest::Contains("captured without max_grad_norm"),
                           std::invalid_argument);
    }
    const auto& g = t == 6 ? clipping.emplace(replayed.capture_step()) : graph;
    if (t == 3)
      for (Emulated* o : {&stepped, &replayed}) o->set_lr(Tier::experts, 5e-3);
    if (t == 4) {  // clipped on the next step
      const double n1 = stepped.clip_grad_norm(0.5);
      const double n2 = replayed.clip_grad_norm(0.5);
      CHECK(n1 == n2);
    }
    if (t == 5) {  // skipped by the kernels: counts, state and parameters stay
      poke(a.tensors[6], 3, std::numeric_limits<float>::infinity());
      poke(b.tensors[6], 3, std::numeric_limits<float>::infinity());
    }
    const long waits = emu::Runtime::waits();
    stepped.step();
    replayed.replay(g);
    // (the first step moves low-precision gradients' tensors to their kernel
    // group, which waits once; the capture did that for the replays)
    if (t > 1) CHECK(emu::Runtime::waits() == waits);
    CHECK(replayed.last_step().applied == (t != 5));
    CHECK(stepped.last_step().applied == (t != 5));
    CHECK(fixture::Snapshot::take(b, replayed) == fixture::Snapshot::take(a, stepped));
  }
  CHECK(replayed.steps() == 5);
  const StepReport& r = replayed.last_step();
  CHECK(r.applied);
  CHECK(replayed.pending_grad_scale() == 1.0);
  CHECK(replayed.last_grad_norm() == stepped.last_grad_norm());
  CHECK(std::isfinite(replayed.last_grad_norm()));
}

TEST_CASE("device counts: what a graph cannot do is refused, naming it, and nothing changes") {
  fixture::Model m = fixture::Model::make(Dtype::f32, /*large=*/false);
  {
    Emulated on_default(hyper());
    const auto ids = m.register_with(on_default);
    set_all(m, on_default, ids);
    REFUSED((void)on_default.capture_step(), "default stream");
  }
  {
    Emulated raising(hyper(), {.nonfinite = NonFinitePolicy::raise, .stream = a_stream});
    const auto ids = m.register_with(raising);
    set_all(m, raising, ids);
    REFUSED((void)raising.capture_step(), "nonfinite policy");
  }
  Emulated opt(hyper(), {.stream = a_stream});
  const auto ids = m.register_with(opt);
  set_all(m, opt, ids);
  fill(m, 1);
  opt.set_lr_schedule(Tier::backbone, [](std::int64_t) { return 1e-3; });
  REFUSED((void)opt.capture_step(), "lr schedule");
  opt.set_lr_schedule(Emulated::Schedule{});
  const auto graph = opt.capture_step();
  opt.replay(graph);
  const fixture::Snapshot after_one = fixture::Snapshot::take(m, opt);
  REQUIRE(opt.steps() == 1);

  opt.set_lr_schedule(Tier::router, [](std::int64_t) { return 1e-3; });
  REFUSED(opt.replay(graph), "lr schedule");
  opt.set_lr_schedule(Emulated::Schedule{});

  opt.set_nonfinite_policy(NonFinitePolicy::unchecked);
  REFUSED(opt.replay(graph), "captured under nonfinite policy skip_step");
  opt.set_nonfinite_policy(NonFinitePolicy::skip_step);

  std::vector<float> other(m.tensors[2].g32.size(), 0.5f);
  opt.set_grad(ids[2], TensorView<const float>(other.data(), m.tensors[2].shape));
  REFUSED(opt.replay(graph), "grad of '" + m.tensors[2].name + "'");
  opt.clear_grad(ids[2]);
  REFUSED(opt.replay(graph), "grad of '" + m.tensors[2].name + "'");
  opt.set_grad(ids[2], m.tensors[2].grad());

  opt.import_state(opt.export_state());
  REFUSED(opt.replay(graph), "captured before the optimizer changed");
  CHECK(fixture::Snapshot::take(m, opt) == after_one);

  // captured again, it replays
  const auto again = opt.capture_step();
  opt.replay(again);
  CHECK(opt.steps() == 2);
  std::vector<float> w(12);
  (void)opt.add("late", Tier::backbone, TensorView<float>(w.data(), {3, 4}));
  REFUSED(opt.replay(again), "captured before the optimizer changed");
  CHECK(opt.steps() == 2);
}

}  // namespace test_device_steps_emulated
