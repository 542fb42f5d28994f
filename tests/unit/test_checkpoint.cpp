// Checkpoints: bit-exact resume, load by name, every corruption class,
// mismatches named exactly, all-or-nothing loading, atomic saving.

#include <doctest/doctest.h>

#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#if defined(__unix__) || defined(__APPLE__)
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>
#endif

#include <skewadam/checkpoint.hpp>
#include <skewadam/detail/crc32c.hpp>
#include <skewadam/skewadam.hpp>

#include "../../fuzz/fuzz_fixture.hpp"
#include "checkpoint_version.hpp"
#include "training_fixture.hpp"

namespace test_checkpoint {

namespace fs = std::filesystem;
using namespace skewadam;
using fixture::Model;
using fixture::Snapshot;

namespace {

/// A fresh folder under the temp directory, removed at the end of the test.
struct TempDir {
  fs::path path;
  TempDir() {
    static int counter = 0;
    path = fs::temp_directory_path() /
           ("skewadam-ckpt-test-" + std::to_string(static_cast<long>(::getpid())) + "-" + std::to_string(counter++));
    fs::remove_all(path);
    fs::create_directories(path);
  }
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(path, ec);
  }
  fs::path operator/(const std::string& f) const { return path / f; }
};

std::vector<std::byte> read_file(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::vector<char> c((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::vector<std::byte> b(c.size());
  if (!c.empty()) std::memcpy(b.data(), c.data(), c.size());
  return b;
}

/// A trained optimizer and its model, for tests that need a checkpoint.
struct Trained {
  Model model = Model::make(Dtype::bf16, /*large=*/false);
  SkewAdam opt = fixture::make_optimizer<SkewAdam>(2, 77);
  std::vector<ParamId> ids = model.register_with(opt);
  Trained() { model.train(opt, ids, 0, 3); }
};

/// Expects loading `bytes` into t.opt to fail with `kind` and to leave it as `before`.
void expect_rejected(Trained& t, const Snapshot& before, const std::vector<std::byte>& bytes,
                     CheckpointError::Kind kind, const std::string& says = {}) {
  bool threw = false;
  try {
    load_checkpoint(t.opt, std::span<const std::byte>(bytes));
  } catch (const CheckpointError& e) {
    threw = true;
    CHECK_MESSAGE(static_cast<int>(e.kind()) == static_cast<int>(kind), e.what());
    if (!says.empty()) CHECK_MESSAGE(std::string(e.what()).find(says) != std::string::npos, e.what());
  }
  CHECK(threw);
  CHECK(Snapshot::take(t.model, t.opt) == before);
}

}  // namespace

TEST_CASE("crc32c: standard check values") {
  using detail::crc32c;
  CHECK(crc32c("123456789", 9) == 0xE3069283u);
  unsigned char zeros[32] = {}, ones[32], inc[32];
  for (int i = 0; i < 32; ++i) {
    ones[i] = 0xff;
    inc[i] = static_cast<unsigned char>(i);
  }
  CHECK(crc32c(zeros, 32) == 0x8A9136AAu);  // RFC 3720, B.4
  CHECK(crc32c(ones, 32) == 0x62A8AB43u);
  CHECK(crc32c(inc, 32) == 0x46DD794Eu);
  // incremental == whole, at every split
  for (std::size_t k = 0; k <= 32; ++k)
    CHECK(detail::crc32c_update(detail::crc32c(inc, k), inc + k, 32 - k) == 0x46DD794Eu);
}

TEST_CASE("rule names identify every policy") {
  CHECK(rule_name<BackboneRule>() ==
        "UpdateRule<FullMomentum, FactoredSecondMoment, RmsUpdateClip, StochasticRounding16>");
  CHECK(rule_name<AdamWRule>() == "UpdateRule<FullMomentum, AdamSecondMoment, NoUpdateClip, StochasticRounding16>");
  CHECK(tier_rule_name<SkewAdamTiers>(Tier::router) ==
        "UpdateRule<NoMomentum, ExactSecondMoment, RmsUpdateClip, StochasticRounding16>");
  CHECK(rule_name<ExpertRule::with_rounding<NearestRounding>>() ==
        "UpdateRule<NoMomentum, FactoredSecondMoment, RmsUpdateClip, NearestRounding>");
}

TEST_CASE("a saved rule name of an earlier rounding stream names the same rule, nothing else does") {
  const std::string now = rule_name<BackboneRule>();
  CHECK(same_saved_rule(now, now));
  CHECK(same_saved_rule("UpdateRule<FullMomentum, FactoredSecondMoment, RmsUpdateClip, StochasticRounding>", now));
  CHECK_FALSE(same_saved_rule("UpdateRule<NoMomentum, FactoredSecondMoment, RmsUpdateClip, StochasticRounding>", now));
  CHECK_FALSE(same_saved_rule("UpdateRule<FullMomentum, FactoredSecondMoment, RmsUpdateClip, NearestRounding>", now));
  const std::string nearest = rule_name<BackboneRule::with_rounding<NearestRounding>>();
  CHECK_FALSE(same_saved_rule("UpdateRule<FullMomentum, FactoredSecondMoment, RmsUpdateClip, StochasticRounding>",
                              nearest));
  CHECK_FALSE(same_saved_rule(now, nearest));
}

TEST_CASE("a checkpoint naming the earlier rounding policy loads, and resumes bit for bit") {
  // A checkpoint as earlier versions wrote it: format version 1, the same
  // records, with the rounding policy named StochasticRounding in every
  // tier's rule.
  fuzz::Fixture trained;
  trained.train(2);
  const std::vector<std::byte> now = checkpoint_bytes(trained.opt, SaveOptions{.include_params = true});
  const std::vector<std::byte> out = test::with_format_version(now, 1, [](CheckpointInfo& c) {
    for (auto& t : c.tiers) {
      const auto at = t.rule.rfind("StochasticRounding16>");
      REQUIRE(at != std::string::npos);
      t.rule.replace(at, t.rule.size() - at, "StochasticRounding>");
    }
  });
  const std::span<const std::byte> legacy(out);
  REQUIRE(read_checkpoint_info(legacy).format_version == 1);
  REQUIRE(read_checkpoint_info(legacy).tiers[1].rule ==
          "UpdateRule<NoMomentum, FactoredSecondMoment, RmsUpdateClip, StochasticRounding>");

  fuzz::Fixture loaded;
  loaded.train(1);  // a different state, which the load must replace
  load_checkpoint(loaded.opt, legacy, LoadOptions{.params = ParamValues::require});
  CHECK(loaded.opt.steps() == 2);
  CHECK(loaded.param_bits() == trained.param_bits());
  trained.train(3);
  loaded.train(3);
  CHECK(loaded.param_bits() == trained.param_bits());
}

TEST_CASE("resume is bit-identical: fp32 and bf16 with stochastic rounding, any thread count, any order") {
  struct Config {
    Dtype weights;
    int threads_before, threads_after;
  };
  const Config configs[] = {{Dtype::f32, 1, 1}, {Dtype::f32, 2, 2}, {Dtype::f32, 1, 2},
                            {Dtype::bf16, 1, 1}, {Dtype::bf16, 2, 2}, {Dtype::bf16, 2, 1},
                            {Dtype::f16, 2, 1}};
  for (const Config& config : configs) {
    const Dtype weights = config.weights;  // plain variables: doctest's CAPTURE cannot name structured bindings
    const int threads_before = config.threads_before, threads_after = config.threads_after;
    {
      {
        CAPTURE(dtype_name(weights));
        CAPTURE(threads_before);
        CAPTURE(threads_after);
        constexpr std::int64_t total = 7, stop = 3;
        // uninterrupted
        Model a = Model::make(weights);
        auto opt_a = fixture::make_optimizer<SkewAdam>(threads_before, 4242);
        const auto ids_a = a.register_with(opt_a);
        a.train(opt_a, ids_a, 0, total);
        const Snapshot expected = Snapshot::take(a, opt_a);

        // interrupted after `stop` steps
        TempDir dir;
        {
          Model b = Model::make(weights);
          auto opt_b = fixture::make_optimizer<SkewAdam>(threads_before, 4242);
          const auto ids_b = b.register_with(opt_b);
          b.train(opt_b, ids_b, 0, stop);
          save_checkpoint(opt_b, dir / "run.ckpt", SaveOptions{.include_params = true});
        }
        // a fresh process: other seed and thread count, reversed registration order
        Model c = Model::make(weights);
        auto opt_c = fixture::make_optimizer<SkewAdam>(threads_after, 1);
        const auto ids_c = c.register_with(opt_c, /*reversed=*/true);
        load_checkpoint(opt_c, dir / "run.ckpt");
        CHECK(opt_c.steps() == stop);
        CHECK(opt_c.seed() == 4242);
        c.train(opt_c, ids_c, stop, total);
        CHECK(Snapshot::take(c, opt_c) == expected);
      }
    }
  }
}

TEST_CASE("a loaded checkpoint saves again with the same content") {
  Trained t;
  const auto first = checkpoint_bytes(t.opt, SaveOptions{.include_params = true, .metadata = {{"k", "v"}}});
  Model m = Model::make(Dtype::bf16, false);
  SkewAdam other = fixture::make_optimizer<SkewAdam>(1, 5);
  m.register_with(other, true);
  load_checkpoint(other, std::span<const std::byte>(first));
  // same names in another registration order: the file lists parameters in registration order
  const auto second = checkpoint_bytes(other, SaveOptions{.include_params = true, .metadata = {{"k", "v"}}});
  CHECK(second.size() == first.size());
  CHECK(Snapshot::take(m, other) == Snapshot::take(t.model, t.opt));
}

TEST_CASE("export_state / import_state round trip and validation") {
  Trained t;
  OptimizerState s = t.opt.export_state();
  CHECK(s.steps == 3);
  CHECK(s.params.size() == t.model.tensors.size());
  CHECK(s.params[0].rounding_stream == tensor_id("embed"));
  const Snapshot before = Snapshot::take(t.model, t.opt);

  auto reject = [&](OptimizerState bad, const std::string& says) {
    try {
      t.opt.import_state(std::move(bad));
      FAIL("import_state accepted a bad state");
    } catch (const std::invalid_argument& e) {
      CHECK_MESSAGE(std::string(e.what()).find(says) != std::string::npos, e.what());
    }
    CHECK(Snapshot::take(t.model, t.opt) == before);
  };
  {
    OptimizerState bad = s;
    bad.params.pop_back();
    reject(std::move(bad), "holds 6 parameters");
  }
  {
    OptimizerState bad = s;
    bad.params[1].state.m.push_back(0.0f);
    reject(std::move(bad), "state of 'blocks.0.attn.q': m has");
  }
  {
    OptimizerState bad = s;
    bad.params[3].state.step = 4;
    reject(std::move(bad), "step = 4");
  }
  {
    OptimizerState bad = s;
    bad.hyperparameters[1].beta2 = 1.5;
    reject(std::move(bad), "experts.beta2");
  }
  s.seed = 99;
  t.opt.import_state(s);
  CHECK(t.opt.seed() == 99);
}

TEST_CASE("checkpoint info lists what the file holds") {
  Trained t;
  TempDir dir;
  save_checkpoint(t.opt, dir / "a.ckpt", SaveOptions{.metadata = {{"run", "moe-1"}, {"note", ""}}});
  const CheckpointInfo info = read_checkpoint_info(dir / "a.ckpt");
  CHECK(info.format_version == 3);
  CHECK(info.steps == 3);
  CHECK(info.seed == 77);
  CHECK_FALSE(info.has_param_values);
  REQUIRE(info.find_metadata("run"));
  CHECK(*info.find_metadata("run") == "moe-1");
  CHECK(info.find_metadata("absent") == nullptr);
  REQUIRE(info.params.size() == t.model.tensors.size());
  CHECK(info.params[3].name == "blocks.1.moe.experts.w1");
  CHECK(info.params[3].tier == Tier::experts);
  CHECK(info.params[3].dtype == Dtype::bf16);
  CHECK(info.params[3].shape == Shape{4, 24, 16});
  REQUIRE(info.params[3].arrays.size() == 2);
  CHECK(info.params[3].arrays[0].name == "v_row");
  CHECK(info.params[3].arrays[0].shape == Shape{4, 24});
  CHECK(info.params[3].arrays[1].shape == Shape{4, 16});
  CHECK(info.params[4].step == 1);  // w2 has a gradient on even steps only
  CHECK(info.tiers[1].hyperparameters.clip_scope == ClipScope::matrix);
  CHECK(info.tiers[0].rule == rule_name<BackboneRule>());
}

TEST_CASE("loading checks names, tiers, dtypes, shapes and rules, and names every mismatch") {
  Trained t;
  const auto bytes = checkpoint_bytes(t.opt);

  SUBCASE("a missing and an extra parameter") {
    Model m = Model::make(Dtype::bf16, false);
    m.tensors[2].name = "blocks.0.ln.renamed";
    SkewAdam opt = fixture::make_optimizer<SkewAdam>(1);
    m.register_with(opt);
    try {
      load_checkpoint(opt, std::span<const std::byte>(bytes));
      FAIL("loaded");
    } catch (const CheckpointError& e) {
      const std::string w = e.what();
      CHECK(e.kind() == CheckpointError::Kind::mismatch);
      CHECK(w.find("'blocks.0.ln.weight': in the checkpoint, not registered") != std::string::npos);
      CHECK(w.find("'blocks.0.ln.renamed': registered, not in the checkpoint") != std::string::npos);
      CHECK(w.find("2 problems") != std::string::npos);
    }
  }
  SUBCASE("shape, dtype and tier") {
    Model m = Model::make(Dtype::bf16, false);
    m.tensors[0].shape = Shape{24, 40};
    m.tensors[3].dtype = Dtype::f32;
    m.tensors[3].init(9);
    m.tensors[6].tier = Tier::experts;
    SkewAdam opt = fixture::make_optimizer<SkewAdam>(1);
    m.register_with(opt);
    const OptimizerState before = opt.export_state();
    try {
      load_checkpoint(opt, std::span<const std::byte>(bytes));
      FAIL("loaded");
    } catch (const CheckpointError& e) {
      const std::string w = e.what();
      CHECK(w.find("'embed': shape [40, 24] in the checkpoint, [24, 40] registered") != std::string::npos);
      CHECK(w.find("'blocks.1.moe.experts.w1': dtype bf16 in the checkpoint, f32 registered (nothing is converted)") !=
            std::string::npos);
      CHECK(w.find("'blocks.1.moe.router': tier router in the checkpoint, experts registered") != std::string::npos);
    }
    CHECK(opt.export_state().steps == before.steps);
  }
  SUBCASE("another optimizer's rules") {
    Model m = Model::make(Dtype::bf16, false);
    UniformAblation opt = fixture::make_optimizer<UniformAblation>(1);
    m.register_with(opt);
    try {
      load_checkpoint(opt, std::span<const std::byte>(bytes));
      FAIL("loaded");
    } catch (const CheckpointError& e) {
      const std::string w = e.what();
      CHECK(e.kind() == CheckpointError::Kind::mismatch);
      CHECK(w.find("tier experts: rule UpdateRule<NoMomentum, FactoredSecondMoment, RmsUpdateClip, "
                   "StochasticRounding16> in the checkpoint, UpdateRule<FullMomentum, FactoredSecondMoment, "
                   "RmsUpdateClip, StochasticRounding16> in this optimizer") != std::string::npos);
      CHECK(w.find("tier backbone") == std::string::npos);
    }
  }
  SUBCASE("parameter values required but absent") {
    try {
      load_checkpoint(t.opt, std::span<const std::byte>(bytes), LoadOptions{.params = ParamValues::require});
      FAIL("loaded");
    } catch (const CheckpointError& e) {
      CHECK(e.kind() == CheckpointError::Kind::mismatch);
      CHECK(std::string(e.what()).find("holds no parameter values") != std::string::npos);
    }
  }
}

TEST_CASE("empty tensors and untouched parameters round-trip") {
  std::vector<float> w(12, 0.5f), g(12, 0.1f), never(12, 0.25f);
  std::vector<bf16> none;
  auto build = [&](SkewAdam& opt) {
    opt.add("empty", Tier::experts, TensorView<bf16>(none.data(), {0, 5}));
    opt.add("w", Tier::backbone, TensorView<float>(w.data(), {3, 4}));
    opt.add("never", Tier::router, TensorView<float>(never.data(), {12}));
  };
  SkewAdam a(Hyperparameters{}, OptimizerOptions{.threads = 1});
  build(a);
  a.set_grad(*a.find("w"), TensorView<const float>(g.data(), {3, 4}));
  a.step();
  const auto bytes = checkpoint_bytes(a, SaveOptions{.include_params = true});
  const CheckpointInfo info = read_checkpoint_info(std::span<const std::byte>(bytes));
  REQUIRE(info.params.size() == 3);
  CHECK(info.params[0].arrays.size() == 1);  // values only: an empty tensor keeps no state
  CHECK(info.params[2].step == 0);
  SkewAdam b(Hyperparameters{}, OptimizerOptions{.threads = 2});
  build(b);
  load_checkpoint(b, std::span<const std::byte>(bytes));
  CHECK(b.state(*b.find("w")).step == 1);
  CHECK(b.state(*b.find("never")).step == 0);
  CHECK(b.steps() == 1);
}

TEST_CASE("parameter values load only when asked") {
  Trained t;
  const auto with_values = checkpoint_bytes(t.opt, SaveOptions{.include_params = true});
  const auto saved = t.model.tensors[1].bits();
  t.model.train(t.opt, t.ids, 3, 4);
  CHECK(t.model.tensors[1].bits() != saved);
  load_checkpoint(t.opt, std::span<const std::byte>(with_values), LoadOptions{.params = ParamValues::ignore});
  CHECK(t.model.tensors[1].bits() != saved);
  CHECK(t.opt.steps() == 3);
  load_checkpoint(t.opt, std::span<const std::byte>(with_values));
  CHECK(t.model.tensors[1].bits() == saved);
}

TEST_CASE("every corruption class is rejected and changes nothing") {
  Trained t;
  const auto good = checkpoint_bytes(t.opt, SaveOptions{.include_params = true});
  t.model.train(t.opt, t.ids, 3, 4);  // so that a wrongly accepted load would show
  const Snapshot before = Snapshot::take(t.model, t.opt);

  SUBCASE("truncated anywhere") {
    for (std::size_t n = 0; n < good.size(); ++n) {
      std::vector<std::byte> cut(good.begin(), good.begin() + static_cast<std::ptrdiff_t>(n));
      CAPTURE(n);
      expect_rejected(t, before, cut, n < 12 ? CheckpointError::Kind::not_a_checkpoint : CheckpointError::Kind::corrupt);
    }
  }
  SUBCASE("any changed byte") {
    for (std::size_t i = 0; i < good.size(); ++i) {
      std::vector<std::byte> bad = good;
      bad[i] ^= std::byte{0x20};
      CAPTURE(i);
      expect_rejected(t, before, bad, i < 12 ? CheckpointError::Kind::not_a_checkpoint : CheckpointError::Kind::corrupt);
    }
  }
  SUBCASE("trailing bytes") {
    std::vector<std::byte> bad = good;
    bad.push_back(std::byte{0});
    expect_rejected(t, before, bad, CheckpointError::Kind::corrupt, "1 byte after the end");
  }
  SUBCASE("another format version") {
    std::vector<std::byte> bad = good;
    bad[12] = std::byte{4};
    const std::uint32_t crc = detail::crc32c(bad.data(), 28);
    for (int k = 0; k < 4; ++k) bad[static_cast<std::size_t>(28 + k)] = static_cast<std::byte>(crc >> (8 * k));
    expect_rejected(t, before, bad, CheckpointError::Kind::unsupported_version, "format version 4; this build reads versions 1 to 3");
  }
  SUBCASE("foreign files") {
    auto bytes_of = []<std::size_t N>(const char (&s)[N]) {
      std::vector<std::byte> b(N - 1);
      std::memcpy(b.data(), s, N - 1);
      return b;
    };
    expect_rejected(t, before, {}, CheckpointError::Kind::not_a_checkpoint, "empty file");
    expect_rejected(t, before, bytes_of("hello"), CheckpointError::Kind::not_a_checkpoint);
    expect_rejected(t, before, bytes_of("\x93NUMPY\x01\x00v\x00{'descr': '<f4', 'fortran_order': False, 'shape': (3,), }"),
                    CheckpointError::Kind::not_a_checkpoint, "unknown signature");
    std::vector<std::byte> noise(4096);
    for (std::size_t i = 0; i < noise.size(); ++i) noise[i] = static_cast<std::byte>(fixture::mix(i));
    expect_rejected(t, before, noise, CheckpointError::Kind::not_a_checkpoint);
  }
}

TEST_CASE("file errors name the file") {
  Trained t;
  TempDir dir;
  try {
    load_checkpoint(t.opt, dir / "absent.ckpt");
    FAIL("loaded");
  } catch (const CheckpointError& e) {
    CHECK(e.kind() == CheckpointError::Kind::io);
    CHECK(std::string(e.what()).find("absent.ckpt: cannot open: no such file") != std::string::npos);
  }
  try {
    load_checkpoint(t.opt, dir.path);
    FAIL("loaded");
  } catch (const CheckpointError& e) {
    CHECK(std::string(e.what()).find("is a directory") != std::string::npos);
  }
  try {
    save_checkpoint(t.opt, dir / "no-such-folder" / "x.ckpt");
    FAIL("saved");
  } catch (const CheckpointError& e) {
    CHECK(e.kind() == CheckpointError::Kind::io);
    CHECK(std::string(e.what()).find("does not exist") != std::string::npos);
  }
}

TEST_CASE("saving is atomic: a failed save leaves the previous checkpoint and no temporary file") {
  Trained t;
  TempDir dir;
  const fs::path file = dir / "opt.ckpt";
  save_checkpoint(t.opt, file);
  const auto first = read_file(file);
  // saving over a folder fails at the rename, after the data was written
  fs::create_directories(dir / "folder" / "inside");
  CHECK_THROWS_AS(save_checkpoint(t.opt, dir / "folder"), CheckpointError);
  CHECK(fs::is_directory(dir / "folder" / "inside"));
  std::size_t entries = 0;
  for ([[maybe_unused]] const auto& e : fs::directory_iterator(dir.path)) ++entries;
  CHECK(entries == 2);  // opt.ckpt and folder
  t.model.train(t.opt, t.ids, 3, 4);
  save_checkpoint(t.opt, file);
  CHECK(read_file(file) != first);
  CHECK(read_checkpoint_info(file).steps == 4);
}

#if defined(__unix__) || defined(__APPLE__)
TEST_CASE("saving is atomic: a process killed while saving leaves a loadable checkpoint") {
  TempDir dir;
  const fs::path file = dir / "big.ckpt";
  // ~24 MB of state, so that the kill lands mid-write
  constexpr index_t rows = 2000, cols = 3000;
  std::vector<float> w(static_cast<std::size_t>(rows * cols), 0.25f), g(w.size(), 0.01f);
  AdamW opt(Hyperparameters{}, OptimizerOptions{.threads = 1});
  const ParamId id = opt.add("w", Tier::backbone, TensorView<float>(w.data(), {rows, cols}));
  opt.set_grad(id, TensorView<const float>(g.data(), {rows, cols}));
  opt.step();
  save_checkpoint(opt, file);
  const auto original = read_file(file);
  opt.step();

  for (int round = 0; round < 2; ++round) {
    const pid_t child = ::fork();
    REQUIRE(child >= 0);
    if (child == 0) {
      for (;;) save_checkpoint(opt, file);  // until killed
    }
    ::usleep(static_cast<useconds_t>(15000 + 40000 * round));
    ::kill(child, SIGKILL);
    int status = 0;
    ::waitpid(child, &status, 0);
    // whatever moment it died at, the file is a complete checkpoint: the old one or a new one
    const CheckpointInfo info = read_checkpoint_info(file);
    CHECK((info.steps == 1 || info.steps == 2));
    AdamW fresh(Hyperparameters{}, OptimizerOptions{.threads = 1});
    std::vector<float> w2(w.size());
    fresh.add("w", Tier::backbone, TensorView<float>(w2.data(), {rows, cols}));
    CHECK_NOTHROW(load_checkpoint(fresh, file));
    // a temporary file may remain after a kill; it is never the checkpoint itself
    for (const auto& e : fs::directory_iterator(dir.path))
      if (e.path() != file) CHECK(e.path().filename().string().rfind(".big.ckpt.tmp-", 0) == 0);
  }
  (void)original;
}
#endif

}  // namespace test_checkpoint
