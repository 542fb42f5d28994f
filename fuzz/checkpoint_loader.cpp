// libFuzzer target for the checkpoint loader: whatever the bytes, loading
// either succeeds or throws CheckpointError, and a rejected file leaves the
// optimizer and its parameters exactly as they were. Any other exception, a
// crash, a sanitizer report or a changed optimizer is a finding.
//
// Each input is loaded twice: as it is, and with its file size and checksums
// repaired, so that mutations reach the decoding behind the checksums instead
// of stopping at them.

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <span>

#include <skewadam/checkpoint.hpp>
#include <skewadam/detail/crc32c.hpp>

#include "fuzz_fixture.hpp"

namespace {

bool same_state(const skewadam::OptimizerState& a, const skewadam::OptimizerState& b) {
  auto same = [](const std::vector<float>& x, const std::vector<float>& y) {
    return x.size() == y.size() && (x.empty() || std::memcmp(x.data(), y.data(), 4 * x.size()) == 0);
  };
  if (a.seed != b.seed || a.steps != b.steps || a.params.size() != b.params.size()) return false;
  for (std::size_t t = 0; t < a.hyperparameters.size(); ++t)
    if (std::memcmp(&a.hyperparameters[t], &b.hyperparameters[t], sizeof a.hyperparameters[t]) != 0) return false;
  for (std::size_t i = 0; i < a.params.size(); ++i) {
    const auto& x = a.params[i];
    const auto& y = b.params[i];
    if (x.rounding_stream != y.rounding_stream || x.state.step != y.state.step || !same(x.state.m, y.state.m) ||
        !same(x.state.v, y.state.v) || !same(x.state.v_row, y.state.v_row) || !same(x.state.v_col, y.state.v_col))
      return false;
  }
  return true;
}

void put_le(std::uint8_t* p, std::uint64_t v, int bytes) {
  for (int i = 0; i < bytes; ++i) p[i] = static_cast<std::uint8_t>(v >> (8 * i));
}

/// The same bytes with the header's file size and every checksum that the
/// record structure allows to be found recomputed.
std::vector<std::uint8_t> repaired(const std::uint8_t* data, std::size_t size) {
  std::vector<std::uint8_t> b(data, data + size);
  if (b.size() < 32) return b;
  put_le(b.data() + 16, b.size(), 8);
  put_le(b.data() + 28, skewadam::detail::crc32c(b.data(), 28), 4);
  std::size_t pos = 32;
  while (b.size() - pos >= 20) {
    std::uint64_t len = 0;
    for (int i = 0; i < 8; ++i) len |= static_cast<std::uint64_t>(b[pos + 8 + static_cast<std::size_t>(i)]) << (8 * i);
    if (len > b.size() - pos - 20) break;
    const std::size_t end = pos + 16 + static_cast<std::size_t>(len);
    put_le(b.data() + end, skewadam::detail::crc32c(b.data() + pos, end - pos), 4);
    pos = end + 4;
  }
  return b;
}

struct Target {
  fuzz::Fixture f;
  skewadam::OptimizerState state;
  std::vector<unsigned char> params;
  Target() {
    f.train(2);
    state = f.opt.export_state();
    params = f.param_bits();
  }
  void restore() {
    f.opt.import_state(state);
    const auto b = params;
    std::size_t at = 0;
    auto get = [&](void* p, std::size_t n) {
      std::memcpy(p, b.data() + at, n);
      at += n;
    };
    get(f.embed.data(), 4 * f.embed.size());
    get(f.router.data(), 4 * f.router.size());
    get(f.w1.data(), 2 * f.w1.size());
    get(f.bias.data(), 2 * f.bias.size());
  }
};

void load(Target& target, const std::uint8_t* data, std::size_t size) {
  const std::span<const std::byte> bytes(reinterpret_cast<const std::byte*>(data), size);
  try {
    (void)skewadam::read_checkpoint_info(bytes);
  } catch (const skewadam::CheckpointError&) {
  }
  try {
    skewadam::load_checkpoint(target.f.opt, bytes);
    target.restore();  // a valid checkpoint: start the next input from the same state
  } catch (const skewadam::CheckpointError&) {
    if (!same_state(target.f.opt.export_state(), target.state) || target.f.param_bits() != target.params) {
      std::fprintf(stderr, "a rejected checkpoint changed the optimizer\n");
      std::abort();
    }
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  static Target target;
  load(target, data, size);
  const std::vector<std::uint8_t> fixed = repaired(data, size);
  load(target, fixed.data(), fixed.size());
  return 0;
}
