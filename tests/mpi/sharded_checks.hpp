#pragma once
// The sharded optimizer against the single-process one, on a mixed model:
// backbone matrices cut into row slices (one of them large enough to be cut
// into row blocks by the single-process backend), bf16 tensors, a rank-1
// tensor, an expert bank dealt out by experts, separately stored experts
// dealt out whole, a router; on any backend and communicator
// (test_sharded_mpi.cpp: the CPU and the emulated CUDA backend over MPI;
// tests/cuda/test_sharded_gpu.cu: the GPU over MPI and NCCL).
//
// Checks: tensors no rank shares are bit-identical to one process; cut
// tensors agree within float rounding (bf16: one ulp); two runs give the same
// bits and every rank holds the same replicated statistics; the exchange and
// state byte counts match their formulas; checkpoints move between the
// sharded and the single-process optimizer; a non-finite gradient or ranks
// that disagree on the stepped tensors change nothing.
//
// The includer defines SKEWADAM_SHARDED_TEST_MEMORY: a type with
// `template <class T> using allocator` (where the model's buffers live: host
// memory, or CUDA managed memory on a GPU) and `static void sync()` (waits
// until the device no longer reads or writes them).

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <random>
#include <span>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <vector>

#include <unistd.h>

#include <skewadam/checkpoint.hpp>
#include <skewadam/dist/sharded_optimizer.hpp>
#include <skewadam/skewadam.hpp>

namespace sharded_test {

using namespace skewadam;
using Memory = SKEWADAM_SHARDED_TEST_MEMORY;
template <class T>
using Buffer = std::vector<T, typename Memory::template allocator<T>>;

inline int failures = 0;
inline int rank_ = 0;

#define SHARDED_EXPECT(cond, what)                                                               \
  do {                                                                                           \
    if (!(cond)) {                                                                               \
      ++::sharded_test::failures;                                                                \
      std::fprintf(stderr, "rank %d: FAILED %s (%s:%d): %s\n", ::sharded_test::rank_, #cond, __FILE__, \
                   __LINE__, std::string(what).c_str());                                         \
    }                                                                                            \
  } while (0)

struct Tensor {
  std::string name;
  Tier tier;
  Shape shape;
  Dtype dtype;
  Buffer<float> f32;  ///< values (f32) ...
  Buffer<bf16> b16;   ///< ... or bf16
  Buffer<float> grad_f32;
  Buffer<bf16> grad_b16;

  ParamView param() {
    if (dtype == Dtype::f32) return TensorView<float>(f32.data(), shape);
    return TensorView<bf16>(b16.data(), shape);
  }
  GradView grad() {
    if (dtype == Dtype::f32) return TensorView<const float>(grad_f32.data(), shape);
    return TensorView<const bf16>(grad_b16.data(), shape);
  }
  float value(index_t i) const { return dtype == Dtype::f32 ? f32[static_cast<std::size_t>(i)] : to_float(b16[static_cast<std::size_t>(i)]); }
};

inline std::vector<Tensor> make_model() {
  std::vector<Tensor> m;
  auto add = [&](std::string name, Tier tier, Shape shape, Dtype dtype) {
    Tensor t{std::move(name), tier, shape, dtype, {}, {}, {}, {}};
    const auto n = static_cast<std::size_t>(shape.numel());
    std::mt19937 gen(static_cast<std::uint32_t>(m.size() + 7));
    std::normal_distribution<float> d(0.0f, 0.1f);
    if (dtype == Dtype::f32) {
      t.f32.resize(n);
      for (auto& x : t.f32) x = d(gen);
      t.grad_f32.resize(n);
    } else {
      t.b16.resize(n);
      for (auto& x : t.b16) x = bf16(d(gen));
      t.grad_b16.resize(n);
    }
    m.push_back(std::move(t));
  };
  add("embed", Tier::backbone, Shape{600, 1024}, Dtype::f32);  // 3 row blocks in one process
  add("attn.q", Tier::backbone, Shape{40, 24}, Dtype::bf16);
  add("norm.weight", Tier::backbone, Shape{24}, Dtype::f32);
  add("moe.experts.w1", Tier::experts, Shape{6, 12, 10}, Dtype::bf16);
  add("moe.expert0.w2", Tier::experts, Shape{12, 10}, Dtype::f32);
  add("moe.expert1.w2", Tier::experts, Shape{12, 10}, Dtype::f32);
  add("moe.expert2.w2", Tier::experts, Shape{12, 10}, Dtype::bf16);
  add("moe.router", Tier::router, Shape{6, 24}, Dtype::f32);
  return m;
}

inline void fill_grads(std::vector<Tensor>& model, int step) {
  Memory::sync();  // the last step may still read the gradients
  for (std::size_t k = 0; k < model.size(); ++k) {
    Tensor& t = model[k];
    std::mt19937 gen(static_cast<std::uint32_t>(1000 * step + k));
    // large gradients on some steps make the update clipping bind
    std::normal_distribution<float> d(0.0f, step % 2 ? 3.0f : 0.01f);
    if (t.dtype == Dtype::f32)
      for (auto& x : t.grad_f32) x = d(gen);
    else
      for (auto& x : t.grad_b16) x = bf16(d(gen));
    // a zero row keeps the floored-row path of the clip sum in play
    if (t.shape.rank() == 2 && t.shape[0] > 4) {
      const index_t c = t.shape[1];
      for (index_t j = 0; j < c; ++j) {
        if (t.dtype == Dtype::f32) t.grad_f32[static_cast<std::size_t>(3 * c + j)] = 0.0f;
        else t.grad_b16[static_cast<std::size_t>(3 * c + j)] = bf16(0.0f);
      }
    }
  }
}

inline PerTier<Hyperparameters> hyper() {
  PerTier<Hyperparameters> h;
  h.backbone = {.lr = 1e-2, .weight_decay = 0.05};
  h.experts = {.lr = 1e-2, .weight_decay = 0.05};
  h.router = {.lr = 1e-2};
  return h;
}

inline constexpr int steps = 6;

/// Runs the sharded optimizer on `model` for `steps` steps.
template <class Backend, class Comm>
void run_sharded(Comm& comm, std::vector<Tensor>& model, std::vector<index_t>* exchange = nullptr) {
  Optimizer<SkewAdamTiers, Backend, dist::Sharded<Comm>> opt(comm, hyper(), OptimizerOptions{.threads = 1});
  for (Tensor& t : model) opt.add(t.name, t.tier, t.param(), t.grad());
  for (int s = 1; s <= steps; ++s) {
    fill_grads(model, s);
    opt.step();
    opt.gather_params();
    if (exchange) exchange->push_back(opt.last_step_exchange_bytes());
  }
}

template <class Opt>
bool is_cut(const Opt& opt, ParamId id) {
  return opt.split(id).cuts_matrices();
}

/// Bytes of a tensor's statistics exchange per step: the CPU engine sends c
/// floats and a double per cut matrix, the CUDA engine c + 1 doubles.
template <class Backend>
index_t statistics_bytes(const dist::TensorSplit& sp) {
  if constexpr (std::is_same_v<Backend, backend::DefaultBackend>) return dist::exchange_bytes(sp, true, false).statistics;
  else return sp.factored && sp.cuts_matrices() ? sp.geom.batch * 8 * (sp.geom.cols + 1) : 0;
}

inline bool close(float got, float want, bool bf16_values) {
  if (std::isnan(got) || std::isnan(want)) return false;
  const double tol = bf16_values ? std::ldexp(std::fabs(static_cast<double>(want)), -7) + 1e-30
                                 : 1e-5 * std::fabs(static_cast<double>(want)) + 1e-7;
  return std::fabs(static_cast<double>(got) - want) <= tol;
}

inline void compare_arrays(const std::string& what, const std::vector<float>& got, const std::vector<float>& want, bool exact,
                    bool bf16_values) {
  SHARDED_EXPECT(got.size() == want.size(), what + ": sizes differ");
  if (got.size() != want.size()) return;
  std::size_t bad = 0, first = 0;
  for (std::size_t i = 0; i < got.size(); ++i) {
    const bool ok = exact ? std::memcmp(&got[i], &want[i], 4) == 0 : close(got[i], want[i], bf16_values);
    if (!ok && bad++ == 0) first = i;
  }
  SHARDED_EXPECT(bad == 0, what + ": " + std::to_string(bad) + " values differ" +
                       (bad ? ", first at " + std::to_string(first) + ": " + std::to_string(got[first]) + " vs " +
                                  std::to_string(want[first])
                            : std::string()));
}

inline std::vector<float> values(const Tensor& t) {
  Memory::sync();
  std::vector<float> v(static_cast<std::size_t>(t.shape.numel()));
  for (std::size_t i = 0; i < v.size(); ++i) v[i] = t.value(static_cast<index_t>(i));
  return v;
}

/// Every check above, the sharded engine of Backend over comm against the
/// local one; returns the number of failed checks over all ranks.
template <class Backend, class Comm>
int run(Comm& comm) {
  rank_ = comm.rank();
  using Sharded = Optimizer<SkewAdamTiers, Backend, dist::Sharded<Comm>>;
  using Single = Optimizer<SkewAdamTiers, Backend>;

  // ------------------------------------------------ against one process
  std::vector<Tensor> single_model = make_model();
  Single single(hyper(), OptimizerOptions{.threads = 1});
  for (Tensor& t : single_model) single.add(t.name, t.tier, t.param(), t.grad());
  for (int s = 1; s <= steps; ++s) {
    fill_grads(single_model, s);
    single.step();
  }

  std::vector<Tensor> model = make_model();
  Sharded opt(comm, hyper(), OptimizerOptions{.threads = 2});  // the second run below: 1 thread
  for (Tensor& t : model) opt.add(t.name, t.tier, t.param(), t.grad());
  std::vector<index_t> exchange;
  for (int s = 1; s <= steps; ++s) {
    fill_grads(model, s);
    opt.step();
    const StepReport r = opt.last_step();
    SHARDED_EXPECT(r.applied, "step " + std::to_string(s) + " applied");
    opt.gather_params();
    exchange.push_back(opt.last_step_exchange_bytes());
  }
  SHARDED_EXPECT(opt.split(*opt.find("moe.experts.w1")).split == dist::Split::matrices, "the bank is dealt out by experts");
  SHARDED_EXPECT(opt.split(*opt.find("moe.expert1.w2")).split == dist::Split::whole, "a single expert is owned whole");
  SHARDED_EXPECT(opt.split(*opt.find("moe.expert1.w2")).owner == 1 % comm.size(), "single experts are dealt round-robin");

  const OptimizerState want = single.export_state();
  const OptimizerState got = opt.export_state();
  for (std::size_t k = 0; k < model.size(); ++k) {
    const ParamId id{static_cast<index_t>(k)};
    const bool exact = !is_cut(opt, id);
    const bool b16 = model[k].dtype == Dtype::bf16;
    compare_arrays(model[k].name + " values", values(model[k]), values(single_model[k]), exact, b16);
    const ParamState& a = got.params[k].state;
    const ParamState& b = want.params[k].state;
    compare_arrays(model[k].name + " m", a.m, b.m, exact, false);
    compare_arrays(model[k].name + " v", a.v, b.v, exact, false);
    compare_arrays(model[k].name + " v_row", a.v_row, b.v_row, exact, false);
    compare_arrays(model[k].name + " v_col", a.v_col, b.v_col, exact, false);
    SHARDED_EXPECT(a.step == b.step, model[k].name + " step count");
  }
  SHARDED_EXPECT(got.steps == want.steps, "step counts");

  // ------------------------------------- every rank holds the same statistics
  for (std::size_t k = 0; k < model.size(); ++k) {
    const ParamId id{static_cast<index_t>(k)};
    const ParamStateView local = opt.local_state(id);
    const auto pieces = opt.pieces(id);
    const index_t c = opt.split(id).geom.cols;
    if (!opt.split(id).factored) continue;
    for (std::size_t q = 0; q < pieces.size(); ++q)
      for (index_t j = 0; j < c; ++j)
        SHARDED_EXPECT(std::memcmp(&local.v_col[q * static_cast<std::size_t>(c) + static_cast<std::size_t>(j)],
                           &got.params[k].state.v_col[static_cast<std::size_t>(pieces[q].matrix * c + j)], 4) == 0,
               model[k].name + ": this rank's copy of C differs from the first owner's");
  }

  // ------------------------------- same bits every run, at any thread count
  std::vector<Tensor> again = make_model();
  run_sharded<Backend, Comm>(comm, again);
  for (std::size_t k = 0; k < model.size(); ++k)
    compare_arrays(model[k].name + " second run", values(again[k]), values(model[k]), true, false);

  // ------------------------------------------------------ byte counts
  {
    index_t want_exchange = 32;
    index_t replicated = 0;
    for (std::size_t k = 0; k < model.size(); ++k) {
      const ParamId id{static_cast<index_t>(k)};
      const dist::TensorSplit& sp = opt.split(id);
      const bool clip = true;  // every SkewAdam rule clips
      want_exchange += statistics_bytes<Backend>(sp) + dist::exchange_bytes(sp, clip, false).clip;
      if (sp.factored && sp.cuts_matrices()) {
        int owners = 0;
        for (int r = 0; r < comm.size(); ++r) owners += sp.pieces(r).empty() ? 0 : 1;
        replicated += (owners - 1) * 4 * sp.geom.batch * sp.geom.cols;
      }
    }
    for (index_t b : exchange) SHARDED_EXPECT(b == want_exchange, "exchange bytes " + std::to_string(b) + " vs " + std::to_string(want_exchange));
    const std::vector<index_t> per_rank = opt.state_bytes_per_rank();
    index_t sum = 0;
    for (index_t b : per_rank) sum += b;
    SHARDED_EXPECT(sum == single.state_bytes() + replicated,
           "state bytes over the ranks " + std::to_string(sum) + " vs " + std::to_string(single.state_bytes()) + " + " +
               std::to_string(replicated) + " replicated");
    SHARDED_EXPECT(per_rank[static_cast<std::size_t>(comm.rank())] == opt.state_bytes(), "this rank's state bytes");
    index_t planned = 0;
    for (std::size_t k = 0; k < model.size(); ++k) {
      const ParamId id{static_cast<index_t>(k)};
      planned += dist::shard_state_bytes(opt.split(id), SkewAdamTiers::layout(model[k].tier), comm.rank());
    }
    SHARDED_EXPECT(planned == opt.state_bytes(), "shard_state_bytes() predicts this rank's state bytes");
  }

  // ------------------------------------------------------- checkpoints
  {
    const std::filesystem::path file =
        std::filesystem::temp_directory_path() / ("skewadam-mpi-test-" + std::to_string(::getpid()) + ".ckpt");
    // every rank needs the same name: take rank 0's
    std::string name = file.string();
    std::uint64_t len = name.size();
    comm.broadcast(std::as_writable_bytes(std::span<std::uint64_t>(&len, 1)), 0);
    name.resize(static_cast<std::size_t>(len));
    comm.broadcast(std::as_writable_bytes(std::span<char>(name.data(), name.size())), 0);

    save_checkpoint(opt, name);
    std::vector<Tensor> fresh_model = make_model();
    Single fresh(hyper());
    for (Tensor& t : fresh_model) fresh.add(t.name, t.tier, t.param(), t.grad());
    load_checkpoint(fresh, name);
    const OptimizerState loaded = fresh.export_state();
    for (std::size_t k = 0; k < model.size(); ++k) {
      compare_arrays(model[k].name + " saved m", loaded.params[k].state.m, got.params[k].state.m, true, false);
      compare_arrays(model[k].name + " saved v_row", loaded.params[k].state.v_row, got.params[k].state.v_row, true, false);
      compare_arrays(model[k].name + " saved v_col", loaded.params[k].state.v_col, got.params[k].state.v_col, true, false);
      compare_arrays(model[k].name + " saved v", loaded.params[k].state.v, got.params[k].state.v, true, false);
    }
    comm.barrier();
    // and back: a single-process checkpoint into a sharded optimizer
    if (comm.rank() == 0) save_checkpoint(single, name);
    comm.barrier();
    std::vector<Tensor> back_model = make_model();
    Sharded back(comm, hyper());
    for (Tensor& t : back_model) back.add(t.name, t.tier, t.param(), t.grad());
    load_checkpoint(back, name);
    const OptimizerState back_state = back.export_state();
    for (std::size_t k = 0; k < model.size(); ++k) {
      compare_arrays(model[k].name + " loaded m", back_state.params[k].state.m, want.params[k].state.m, true, false);
      compare_arrays(model[k].name + " loaded v_col", back_state.params[k].state.v_col, want.params[k].state.v_col, true,
                     false);
    }
    SHARDED_EXPECT(back.steps() == single.steps(), "loaded step count");
    comm.barrier();
    if (comm.rank() == 0) std::filesystem::remove(name);
  }

  // ------------------------------------------------ rejected steps change nothing
  {
    fill_grads(model, steps + 1);
    Tensor& embed = model[0];
    const index_t bad = embed.shape.numel() - 5;  // in the last rank's rows
    embed.grad_f32[static_cast<std::size_t>(bad)] = NAN;
    const OptimizerState before = opt.export_state();
    opt.step();
    const StepReport r = opt.last_step();
    SHARDED_EXPECT(!r.applied, "a NaN gradient skips the step on every rank");
    SHARDED_EXPECT(r.nonfinite && r.nonfinite->name == "embed" && r.nonfinite->element == bad, "the report names it");
    const OptimizerState after = opt.export_state();
    SHARDED_EXPECT(after.steps == before.steps, "step count unchanged");
    for (std::size_t k = 0; k < model.size(); ++k)
      compare_arrays(model[k].name + " unchanged", after.params[k].state.v_col, before.params[k].state.v_col, true,
                     false);

    embed.grad_f32[static_cast<std::size_t>(bad)] = 0.0f;
    if (comm.size() > 1) {  // (one rank always agrees with itself)
      if (comm.rank() == comm.size() - 1) opt.clear_grad(*opt.find("moe.router"));
      bool threw = false;
      try {
        opt.step();
      } catch (const std::invalid_argument& e) {
        threw = std::string(e.what()).find("different set of parameters") != std::string::npos;
      }
      SHARDED_EXPECT(threw, "ranks that disagree on the stepped tensors raise on every rank");
      SHARDED_EXPECT(opt.steps() == before.steps, "and change nothing");
    }
  }

  std::vector<int> all(static_cast<std::size_t>(comm.size()));
  dist::all_gather_values<Comm, int>(comm, std::span<const int>(&failures, 1), std::span<int>(all));
  int all_failures = 0;
  for (int f : all) all_failures += f;
  return all_failures;
}


}  // namespace sharded_test
