// The CPU backend's lane code against the scalar definitions it replaces:
//   - Philox4x32-10 on SIMD lanes (random_lanes.hpp) against random_bits()
//     (random.hpp, Random123's scalar Philox), through generate(),
//     RandomWindow and its runs, for keys and counters that exercise every
//     word;
//   - bf16 stochastic and round-to-nearest stores on integer lanes against
//     StochasticRounding / NearestRounding::store (special values included);
//   - bf16 and fp16 loads widened in registers against to_float().

#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#include <skewadam/skewadam.hpp>

#include "cpu_archs.hpp"

namespace test_cpu_lanes {

namespace {

using namespace skewadam;
using namespace skewadam::backend::cpu;

using test::SimdArchs;

std::uint64_t mix(std::uint64_t x) {
  x ^= x >> 31;
  x *= 0x7fb5d329728ea185ULL;
  x ^= x >> 27;
  x *= 0x81dadef4bc2dd44dULL;
  x ^= x >> 33;
  return x;
}

const RoundingKey keys[] = {
    RoundingKey{0, 0, 1},
    RoundingKey{0x5eed5eedULL, tensor_id("blocks.1.moe.experts.w1"), 17},
    RoundingKey{0xfedcba9876543210ULL, 0xffffffffu, (std::uint64_t{7} << 32) + 3},  // step above 2^32
};

/// Float bit patterns: every exponent with assorted mantissas, and the
/// special values (zeros, subnormals, max finite, infinities, NaNs).
std::vector<std::uint32_t> float_patterns() {
  std::vector<std::uint32_t> v = {0x00000000u, 0x80000000u, 0x00000001u, 0x807fffffu, 0x00008000u, 0x0000ffffu,
                                  0x7f7fffffu, 0xff7fffffu, 0x7f7f8000u, 0x7f7f7fffu, 0x7f800000u, 0xff800000u,
                                  0x7fc00000u, 0xffc00000u, 0x7f800001u, 0xff8fffffu, 0x7fbfffffu, 0x3f800000u,
                                  0x3f808000u, 0x3f818000u, 0x3f80ffffu, 0xbf7f8000u};
  for (std::uint32_t e = 0; e < 256; ++e)
    for (std::uint32_t k = 0; k < 24; ++k) {
      const std::uint32_t m = static_cast<std::uint32_t>(mix(e * 131 + k)) & 0x007fffffu;
      v.push_back((e << 23) | m | ((k & 1u) << 31));
    }
  return v;
}

}  // namespace

TEST_CASE_TEMPLATE_DEFINE("Philox on SIMD lanes gives the scalar definition's bits", Arch, philox_lanes) {
  {
    using PL = PhiloxLanes<Arch>;
    CAPTURE(Arch::name());
    std::vector<std::uint32_t> out(static_cast<std::size_t>(PL::elements));
    // block counters: small, around the 2^32 boundary of the low word, above it
    const std::uint64_t starts[] = {0, 4096, (std::uint64_t{1} << 32) - 4096, std::uint64_t{1} << 32,
                                    (std::uint64_t{3} << 40) + 1024};
    for (const RoundingKey& key : keys)
      for (std::uint64_t s : starts)
        for (std::uint64_t k0 = s; k0 < s + 4 * PL::lanes * PL::chains; k0 += PL::lanes * PL::chains) {
          PL::generate(key, k0, out.data());
          bool ok = true;
          for (index_t i = 0; i < PL::elements; ++i)
            ok = ok && out[static_cast<std::size_t>(i)] ==
                           random_bits(key, static_cast<index_t>(elements_per_block * k0) + i);
          CAPTURE(k0);
          CHECK(ok);
        }
  }
}
TEST_CASE_TEMPLATE_APPLY(philox_lanes, SimdArchs);

TEST_CASE_TEMPLATE_DEFINE("RandomWindow serves random_bits for any access pattern", Arch, random_window) {
  {
    CAPTURE(Arch::name());
    constexpr index_t w = static_cast<index_t>(xsimd::batch<float, Arch>::size);
    for (const RoundingKey& key : keys) {
      // rows of odd length walked with vectors and scalar tails, starting anywhere
      for (index_t start : {index_t{0}, index_t{3}, RandomWindow<Arch>::window - 5, index_t{1} << 33}) {
        RandomWindow<Arch> rng(key);
        bool ok = true;
        index_t e = start;
        for (int row = 0; row < 40; ++row) {
          const index_t cols = 37 + 13 * (row % 5);
          index_t j = 0;
          for (; j + w <= cols; j += w) {
            const std::uint32_t* p = rng.at(e + j, w);
            for (index_t k = 0; k < w; ++k) ok = ok && p[k] == random_bits(key, e + j + k);
          }
          for (; j < cols; ++j) ok = ok && rng(e + j) == random_bits(key, e + j);
          e += cols;
        }
        CAPTURE(start);
        CHECK(ok);
      }
    }
  }
}
TEST_CASE_TEMPLATE_APPLY(random_window, SimdArchs);

TEST_CASE_TEMPLATE_DEFINE("RandomWindow runs serve random_bits as the store loops walk them", Arch, random_run) {
  {
    CAPTURE(Arch::name());
    constexpr index_t w = static_cast<index_t>(xsimd::batch<float, Arch>::size);
    constexpr index_t window = RandomWindow<Arch>::window;
    for (const RoundingKey& key : keys) {
      for (index_t start : {index_t{0}, index_t{3}, window - 5, window - w, index_t{1} << 33}) {
        RandomWindow<Arch> rng(key);
        bool ok = true;
        int runs = 0;
        index_t e = start;
        const index_t end = start + 5 * window + 7;
        // as the kernels' for_lanes_stored: whole vectors from each run
        while (e + w <= end) {
          const RandomRun run = rng.run(e, w);
          ++runs;
          ok = ok && run.first == e && run.count >= w && run.count <= window + w;
          const index_t stop = e + std::min(run.count, end - e) / w * w;
          for (; e < stop; e += w) {
            const std::uint32_t* p = run.at(e, w);
            for (index_t k = 0; k < w; ++k) ok = ok && p[k] == random_bits(key, e + k) && run(e + k) == p[k];
          }
        }
        CAPTURE(start);
        CHECK(ok);
        // one run per window crossed, not one per vector
        CHECK(runs <= 7);
      }
    }
  }
}
TEST_CASE_TEMPLATE_APPLY(random_run, SimdArchs);

TEST_CASE_TEMPLATE_DEFINE("bf16 stores on lanes round exactly as the policies", Arch, bf16_store) {
  {
    CAPTURE(Arch::name());
    using F = xsimd::batch<float, Arch>;
    constexpr index_t w = static_cast<index_t>(F::size);
    std::vector<std::uint32_t> bits = float_patterns();
    while (static_cast<index_t>(bits.size()) % w) bits.push_back(0x3f800000u);
    const auto n = static_cast<index_t>(bits.size());
    std::vector<float> x(bits.size());
    std::memcpy(x.data(), bits.data(), bits.size() * sizeof(float));
    for (const RoundingKey& key : keys) {
      std::vector<bf16> sr(bits.size()), rne(bits.size());
      RandomWindow<Arch> rng(key);
      for (index_t i = 0; i < n; i += w) {
        store_param<StochasticRounding>(sr.data() + i, F::load_unaligned(x.data() + i), i, rng);
        store_param<NearestRounding>(rne.data() + i, F::load_unaligned(x.data() + i), i, rng);
      }
      int bad_sr = 0, bad_rne = 0;
      for (index_t i = 0; i < n; ++i) {
        const auto k = static_cast<std::size_t>(i);
        const bf16 want_sr = StochasticRounding::store<bf16>(x[k], random_bits(key, i));
        const bf16 want_rne = NearestRounding::store<bf16>(x[k], 0u);
        bad_sr += bits_of(sr[k]) != bits_of(want_sr);
        bad_rne += bits_of(rne[k]) != bits_of(want_rne);
      }
      CHECK(bad_sr == 0);
      CHECK(bad_rne == 0);
    }
  }
}
TEST_CASE_TEMPLATE_APPLY(bf16_store, SimdArchs);

TEST_CASE_TEMPLATE_DEFINE("bf16 and fp16 loads widen every bit pattern exactly", Arch, widen) {
  {
    CAPTURE(Arch::name());
    using F = xsimd::batch<float, Arch>;
    constexpr index_t w = static_cast<index_t>(F::size);
    std::vector<bf16> b(65536);
    std::vector<f16> h(65536);
    for (std::uint32_t i = 0; i < 65536; ++i) {
      b[i] = from_bits<bf16>(static_cast<std::uint16_t>(i));
      h[i] = from_bits<f16>(static_cast<std::uint16_t>(i));
    }
    int bad_b = 0, bad_h = 0;
    alignas(64) float got[64];
    for (index_t i = 0; i < 65536; i += w) {
      load_as<F>(b.data() + i).store_aligned(got);
      for (index_t k = 0; k < w; ++k) {
        const float want = to_float(b[static_cast<std::size_t>(i + k)]);
        bad_b += float_bits(got[k]) != float_bits(want);
      }
      load_as<F>(h.data() + i).store_aligned(got);
      for (index_t k = 0; k < w; ++k) {
        const float want = to_float(h[static_cast<std::size_t>(i + k)]);
        const bool both_nan = std::isnan(got[k]) && std::isnan(want);
        bad_h += !both_nan && float_bits(got[k]) != float_bits(want);
      }
    }
    CHECK(bad_b == 0);
    CHECK(bad_h == 0);
  }
}
TEST_CASE_TEMPLATE_APPLY(widen, SimdArchs);

}  // namespace test_cpu_lanes
