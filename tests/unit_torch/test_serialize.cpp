// save()/load() through torch::serialize: a resumed run is bit-identical to an
// uninterrupted one, a checkpoint that does not fit is refused without
// changing anything, and the archive carries the library's own checkpoint;
// save_checkpoint()/load_checkpoint() write and read the library's file itself.

#include <skewadam/torch/optimizer.hpp>

#include "doctest_torch.hpp"

#include <torch/torch.h>

#include <cstddef>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <span>
#include <sstream>
#include <string>
#include <vector>

#include "torch_test_support.hpp"

namespace test_serialize {

namespace {

using namespace skewadam_torch_test;

template <class Opt>
void run_steps(Opt& opt, const Named& ps, const Named& grads_shape, int from, int to) {
  for (int k = from; k <= to; ++k) {
    set_grads(ps, grads_for_step(grads_shape, k));
    opt.step();
  }
}

template <class Opt>
std::string saved(const Opt& opt) {
  std::ostringstream out;
  torch::serialize::OutputArchive archive;
  opt.save(archive);
  archive.save_to(out);
  return out.str();
}

/// Step counts and state arrays of every parameter, copied.
template <class Opt>
std::vector<torch::Tensor> snapshot(const Opt& opt) {
  std::vector<torch::Tensor> out;
  out.push_back(torch::tensor({opt.steps()}));
  for (const auto& name : opt.names()) {
    const auto& s = opt.param_state(name);
    out.push_back(torch::tensor({s.step}));
    for (const torch::Tensor* t : {&s.m, &s.v, &s.v_row, &s.v_col})
      out.push_back(t->defined() ? t->clone() : torch::Tensor());
  }
  return out;
}

inline bool same_state(const std::vector<torch::Tensor>& a, const std::vector<torch::Tensor>& b) {
  if (a.size() != b.size()) return false;
  for (std::size_t i = 0; i < a.size(); ++i) {
    if (a[i].defined() != b[i].defined()) return false;
    if (a[i].defined() && !same_bits(a[i], b[i])) return false;
  }
  return true;
}

template <class Opt>
void load_into(Opt& opt, const std::string& bytes) {
  std::istringstream in(bytes);
  torch::serialize::InputArchive archive;
  archive.load_from(in);
  opt.load(archive);
}

template <class Opt>
void check_resume(int k, int n, bool load_into_used_optimizer) {
  const Named start = make_params();
  // uninterrupted
  const Named full = clone(start);
  Opt a(full, test_options());
  run_steps(a, full, start, 1, n);

  // steps 1..k, save, then a new optimizer on a copy of the parameters
  const Named first = clone(start);
  Opt b(first, test_options());
  run_steps(b, first, start, 1, k);
  const std::string checkpoint = saved(b);

  const Named resumed = clone(first);
  Opt c(resumed, test_options(/*seed=*/1));  // the checkpoint's seed wins
  if (load_into_used_optimizer) {
    run_steps(c, resumed, start, 1, 2);  // state and parameters get overwritten...
    for (std::size_t i = 0; i < resumed.size(); ++i) resumed[i].second.detach().copy_(first[i].second);
  }
  load_into(c, checkpoint);
  CHECK(c.seed() == 5);
  CHECK(c.steps() == k);
  for (const auto& name : c.names()) CHECK(c.param_state(name).step == b.param_state(name).step);
  run_steps(c, resumed, start, k + 1, n);
  for (std::size_t i = 0; i < full.size(); ++i) {
    INFO("parameter " << full[i].first);
    CHECK(same_bits(full[i].second, resumed[i].second));
  }
  CHECK(same_state(snapshot(a), snapshot(c)));
}

}  // namespace

TEST_CASE("a checkpoint moves from the test device to the CPU and back, state bit for bit") {
  const Named start = make_params();
  const Named device_params = clone(start);
  skewadam::libtorch::SkewAdam a(device_params, test_options());
  run_steps(a, device_params, start, 1, 4);

  Named host_params;
  for (const auto& [name, t] : device_params) host_params.emplace_back(name, t.detach().to(torch::kCPU).clone());
  skewadam::libtorch::SkewAdam on_host(host_params, test_options(/*seed=*/1));
  load_into(on_host, saved(a));
  CHECK(on_host.steps() == 4);
  CHECK(on_host.seed() == 5);
  CHECK(same_state(snapshot(a), snapshot(on_host)));

  const Named back_params = clone(device_params);
  skewadam::libtorch::SkewAdam back(back_params, test_options(/*seed=*/2));
  load_into(back, saved(on_host));
  CHECK(same_state(snapshot(a), snapshot(back)));
  // and the resumed optimizer goes on exactly as the uninterrupted one
  run_steps(a, device_params, start, 5, 7);
  run_steps(back, back_params, start, 5, 7);
  CHECK(same_bits(device_params, back_params));
  CHECK(same_state(snapshot(a), snapshot(back)));
}

TEST_CASE_TEMPLATE("save, load and resume bit for bit (fp32 and bf16 with stochastic rounding)", Opt,
                   skewadam::libtorch::SkewAdam, skewadam::libtorch::UniformAblation,
                   skewadam::libtorch::AdafactorLike, skewadam::libtorch::AdamW,
                   skewadam::libtorch::SkewAdamBf16Momentum, skewadam::libtorch::SkewAdam8bit) {
  SUBCASE("into a fresh optimizer") { check_resume<Opt>(4, 9, false); }
  SUBCASE("into an optimizer that has already stepped") { check_resume<Opt>(5, 8, true); }
  SUBCASE("at step 0") { check_resume<Opt>(0, 3, false); }
}

TEST_CASE("torch::save and torch::load work on the optimizer") {
  const Named start = make_params();
  const Named a = clone(start);
  skewadam::libtorch::SkewAdam opt(a, test_options());
  run_steps(opt, a, start, 1, 3);
  std::stringstream buffer;
  torch::save(opt, buffer);
  const Named b = clone(a);
  skewadam::libtorch::SkewAdam other(b, test_options());
  torch::load(other, buffer);
  run_steps(opt, a, start, 4, 5);
  run_steps(other, b, start, 4, 5);
  CHECK(same_bits(a, b));
}

TEST_CASE("load restores the param groups' hyperparameters") {
  const Named start = make_params(false);
  const Named a = clone(start);
  skewadam::libtorch::SkewAdam opt(a, test_options());
  opt.group_options(skewadam::Tier::experts).set_lr(0.25);
  opt.group_options(skewadam::Tier::router).hyperparameters().clip_threshold = 0.5;
  const std::string checkpoint = saved(opt);
  const Named b = clone(start);
  skewadam::libtorch::SkewAdam other(b, test_options());
  load_into(other, checkpoint);
  CHECK(other.group_options(skewadam::Tier::experts).get_lr() == 0.25);
  CHECK(other.group_options(skewadam::Tier::router).hyperparameters().clip_threshold == 0.5);
  CHECK(other.group_options(skewadam::Tier::backbone).get_lr() == 2e-3);
}

TEST_CASE("a checkpoint that does not fit is refused and nothing changes") {
  const Named start = make_params();
  const Named a = clone(start);
  skewadam::libtorch::SkewAdam opt(a, test_options());
  run_steps(opt, a, start, 1, 3);
  const std::string checkpoint = saved(opt);

  const Named b = clone(start);
  auto expect_refused = [&](auto& target, const Named& params, const std::string& needle) {
    run_steps(target, params, params, 1, 2);
    const auto before = snapshot(target);
    const Named values = clone(params);
    std::string message = "no exception";
    try {
      load_into(target, checkpoint);
    } catch (const std::invalid_argument& e) {
      message = e.what();
    }
    INFO(message);
    CHECK(message.find(needle) != std::string::npos);
    CHECK(same_state(snapshot(target), before));
    CHECK(same_bits(values, params));
  };

  SUBCASE("another rule") {
    skewadam::libtorch::UniformAblation other(b, test_options());
    expect_refused(other, b, "in the checkpoint, " + skewadam::tier_rule_name<skewadam::UniformTiers>(skewadam::Tier::experts) + " in this optimizer");
  }
  SUBCASE("a parameter missing") {
    Named fewer(b.begin(), b.end() - 1);
    skewadam::libtorch::SkewAdam other(fewer, test_options());
    expect_refused(other, fewer, "'" + b.back().first + "': in the checkpoint, not registered");
  }
  SUBCASE("a renamed parameter") {
    Named renamed = b;
    renamed[0].first = "embedding.weight";
    skewadam::libtorch::SkewAdam other(renamed, test_options());
    expect_refused(other, renamed, "'tok_emb.weight': in the checkpoint, not registered");
  }
  SUBCASE("another tier") {
    skewadam::libtorch::Options o = test_options();
    o.tier_rules = skewadam::TierAssigner::from_strings({"router=backbone"});
    skewadam::libtorch::SkewAdam other(b, o);
    expect_refused(other, b, "tier router in the checkpoint, backbone registered");
  }
  SUBCASE("another shape") {
    Named reshaped = b;
    reshaped[0].second = on(torch::zeros({20, 32}));
    skewadam::libtorch::SkewAdam other(reshaped, test_options());
    expect_refused(other, reshaped, "shape [40, 16] in the checkpoint, [20, 32] registered");
  }
  SUBCASE("another dtype") {
    Named cast = b;
    cast[0].second = cast[0].second.to(torch::kBFloat16);
    skewadam::libtorch::SkewAdam other(cast, test_options());
    expect_refused(other, cast, "dtype f32 in the checkpoint, bf16 registered");
  }
}

TEST_CASE("export_state and import_state: a resumed run repeats the uninterrupted one; a bad state changes nothing") {
  const Named start = make_params();
  const Named a = clone(start);
  skewadam::libtorch::SkewAdam opt(a, test_options(9));
  run_steps(opt, a, start, 1, 3);
  const skewadam::OptimizerState state = opt.export_state();
  CHECK(state.steps == 3);
  CHECK(state.seed == 9);
  REQUIRE(state.params.size() == opt.names().size());
  const Named values = clone(a);

  const Named b = clone(start);
  skewadam::libtorch::Options other = test_options(1);
  other.hyperparameters.experts.lr = 0.5;
  skewadam::libtorch::SkewAdam resumed(b, other);
  run_steps(resumed, b, start, 1, 1);
  const auto before = snapshot(resumed);
  const Named b_before = clone(b);
  skewadam::OptimizerState bad = state;
  bad.params[4].state.v_row.pop_back();  // blocks.1.moe.experts.gate_proj
  CHECK_THROWS_WITH_AS(resumed.import_state(bad), doctest::Contains("blocks.1.moe.experts.gate_proj"),
                       std::invalid_argument);
  bad = state;
  bad.params.pop_back();
  CHECK_THROWS_AS(resumed.import_state(bad), std::invalid_argument);
  CHECK(same_state(snapshot(resumed), before));
  CHECK(same_bits(b_before, b));

  for (std::size_t i = 0; i < b.size(); ++i) b[i].second.detach().copy_(values[i].second);
  resumed.import_state(state);
  CHECK(resumed.group_options(skewadam::Tier::experts).get_lr() == 3e-3);  // the state's hyperparameters
  CHECK(resumed.seed() == 9);
  CHECK(same_state(snapshot(resumed), snapshot(opt)));
  run_steps(opt, a, start, 4, 6);
  run_steps(resumed, b, start, 4, 6);
  CHECK(same_bits(a, b));
  CHECK(same_state(snapshot(resumed), snapshot(opt)));
}

TEST_CASE("the archive carries the library's checkpoint: it loads into skewadam::Optimizer and back") {
  const Named start = make_params();
  const Named a = clone(start);
  skewadam::libtorch::SkewAdam opt(a, test_options());
  run_steps(opt, a, start, 1, 3);
  const std::string archive_bytes = saved(opt);

  // the byte tensor under "checkpoint" is a file of docs/checkpoint-format.md
  std::istringstream in(archive_bytes);
  torch::serialize::InputArchive archive;
  archive.load_from(in);
  torch::Tensor t;
  archive.read("checkpoint", t, true);
  REQUIRE((t.scalar_type() == torch::kByte));
  const std::span<const std::byte> bytes(reinterpret_cast<const std::byte*>(t.data_ptr<std::uint8_t>()),
                                         static_cast<std::size_t>(t.numel()));
  CHECK(bytes.size() > 0);
  const skewadam::CheckpointInfo info = skewadam::read_checkpoint_info(bytes);
  CHECK(info.steps == 3);
  CHECK(info.params.size() == opt.names().size());

  // ... which the library's own optimizer loads, holding the same parameters
  const Named b = clone(a);
  skewadam::SkewAdam core(test_options().hyperparameters);
  for (const auto& [name, tensor] : b) {
    namespace d = skewadam::libtorch::detail;
    core.add(name, opt.tier(name), d::param_view(tensor, d::dtype_of_tensor(tensor, name), d::shape_of_tensor(tensor, name)));
  }
  skewadam::load_checkpoint(core, bytes);
  const skewadam::OptimizerState x = core.export_state(), y = opt.engine_core().export_state();
  REQUIRE(x.params.size() == y.params.size());
  CHECK(x.steps == y.steps);
  for (std::size_t i = 0; i < x.params.size(); ++i) {
    CHECK(x.params[i].state.step == y.params[i].state.step);
    CHECK((x.params[i].state.m == y.params[i].state.m));
    CHECK((x.params[i].state.v == y.params[i].state.v));
    CHECK((x.params[i].state.v_row == y.params[i].state.v_row));
    CHECK((x.params[i].state.v_col == y.params[i].state.v_col));
  }
  // and what the library writes loads into the adapter
  const std::vector<std::byte> written = skewadam::checkpoint_bytes(core);
  torch::serialize::OutputArchive out_archive;
  out_archive.write("skewadam_format", c10::IValue(skewadam::libtorch::archive_format_version));
  out_archive.write("checkpoint",
                    torch::from_blob(const_cast<std::byte*>(written.data()), {static_cast<std::int64_t>(written.size())},
                                     torch::kByte)
                        .clone(),
                    true);
  std::ostringstream out;
  out_archive.save_to(out);
  const Named c = clone(start);
  skewadam::libtorch::SkewAdam other(c, test_options());
  load_into(other, out.str());
  CHECK(same_state(snapshot(other), snapshot(opt)));
}

TEST_CASE("save_checkpoint writes the file skewadam::save_checkpoint writes; load_checkpoint reads it back") {
  namespace fs = std::filesystem;
  namespace d = skewadam::libtorch::detail;
  const fs::path dir = fs::temp_directory_path() / "skewadam-torch-checkpoint-file";
  fs::create_directories(dir);
  auto bytes_of = [](const fs::path& f) {
    std::ifstream in(f, std::ios::binary);
    return std::vector<char>(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  };
  const Named start = make_params();
  const Named a = clone(start);
  skewadam::libtorch::SkewAdam opt(a, test_options());
  run_steps(opt, a, start, 1, 3);
  opt.save_checkpoint(dir / "adapter.ckpt", skewadam::SaveOptions{.include_params = true});

  // On the CPU engine: the library's optimizer over the same values, the
  // same steps, writes the same file, byte for byte (a device engine adds in
  // another order: its file is checked by what it resumes, below).
  if (test_device().is_cpu() && skewadam::libtorch::device_core<skewadam::SkewAdamTiers>("cpu") == nullptr) {
    const Named b = clone(start);
    skewadam::SkewAdam core(test_options().hyperparameters, skewadam::OptimizerOptions{.seed = opt.seed()});
    std::vector<skewadam::ParamId> ids;
    for (const auto& [name, t] : b)
      ids.push_back(core.add(name, opt.tier(name), d::param_view(t, d::dtype_of_tensor(t, name), d::shape_of_tensor(t, name))));
    for (int k = 1; k <= 3; ++k) {
      const std::vector<torch::Tensor> g = grads_for_step(start, k);
      for (std::size_t i = 0; i < g.size(); ++i) {
        if (!g[i].defined()) {
          core.clear_grad(ids[i]);
          continue;
        }
        const std::string& name = b[i].first;
        core.set_grad(ids[i], d::grad_view(g[i], d::dtype_of_tensor(g[i], name), d::shape_of_tensor(g[i], name)));
      }
      core.step();
    }
    skewadam::save_checkpoint(core, dir / "core.ckpt", skewadam::SaveOptions{.include_params = true});
    CHECK(bytes_of(dir / "adapter.ckpt") == bytes_of(dir / "core.ckpt"));
  }

  // The file loads into a fresh adapter: state, hyperparameters and the
  // parameter values; both then go on with the same bits.
  const Named c = clone(start);
  skewadam::libtorch::Options o = test_options();
  o.hyperparameters.experts.lr = 0.5;
  skewadam::libtorch::SkewAdam resumed(c, o);
  resumed.load_checkpoint(dir / "adapter.ckpt");
  CHECK(resumed.group_options(skewadam::Tier::experts).hyperparameters().lr ==
        test_options().hyperparameters.experts.lr);
  CHECK(resumed.steps() == 3);
  CHECK(same_bits(a, c));
  CHECK(same_state(snapshot(resumed), snapshot(opt)));
  run_steps(opt, a, start, 4, 5);
  run_steps(resumed, c, start, 4, 5);
  CHECK(same_bits(a, c));
  CHECK(same_state(snapshot(resumed), snapshot(opt)));

  // A file of another rule is refused, naming the tier, and nothing changes.
  const Named e = clone(start);
  skewadam::libtorch::SkewAdam8bit other(e, test_options());
  const auto before = snapshot(other);
  CHECK_THROWS_WITH_AS(other.load_checkpoint(dir / "adapter.ckpt"), doctest::Contains("backbone"),
                       skewadam::CheckpointError);
  CHECK(same_state(snapshot(other), before));
  CHECK(same_bits(e, start));
  CHECK(other.steps() == 0);
}

}  // namespace test_serialize
