#pragma once
// Philox4x32-10 on SIMD lanes: the same bits as skewadam::random_bits (the
// scalar Random123 definition in random.hpp), many blocks at a time.
//
// Element e of a tensor takes 16 bits of Philox block e / 8, counter
// (e / 8, step, tensor ^ step_hi), key seed: the low half of word (e mod 4)
// for e mod 8 < 4, the high half otherwise. PhiloxLanes<Arch>::generate
// computes lanes * chains consecutive blocks, one block per lane and chain,
// and returns their elements' bits in element order. Lane 4q + r computes
// block n r + q (n = lanes / 4): after the per-128-bit-chunk 4 x 4 transpose
// of the four output words, chunk q of output vector r holds block n r + q,
// i.e. the vectors hold the blocks' words in block order, with no cross-chunk
// shuffles; each block's four words then give its eight elements' halves.
//
// RandomWindow<Arch> serves the bits of a run of increasing element indices
// from a small buffer (one window of generated elements, with the previous
// window's last vector in front), so a kernel reads its random bits as one
// vector load per vector of elements. Architectures without native lane
// primitives fill the buffer with the scalar definition.
// tests/unit/test_cpu_lanes.cpp checks every path against random_bits().

#include <cstdint>
#include <cstring>

#include "../../../detail/config.hpp"
#include "../../../math/random.hpp"
#include "neon64_lanes.hpp"
#include "x86_lanes.hpp"

namespace skewadam::backend::cpu {

template <class Arch>
struct PhiloxLanes {
  using U = xsimd::batch<std::uint32_t, Arch>;
  using Ops = LaneOps<Arch>;
  static constexpr index_t lanes = static_cast<index_t>(U::size);
  /// Independent Philox evaluations interleaved per call: the ten rounds are
  /// a dependency chain, several chains keep the multipliers busy.
  static constexpr int chains = 4;
  /// Philox blocks per call, and the elements they serve.
  static constexpr index_t blocks = lanes * chains;
  static constexpr index_t elements = elements_per_block * blocks;

  /// The random bits of elements [8 k0, 8 k0 + elements); k0 must be a
  /// multiple of lanes * chains.
  static void generate(const RoundingKey& key, std::uint64_t k0, std::uint32_t* out) noexcept {
    if constexpr (Ops::native && lanes % 4 == 0) {
      constexpr index_t n = lanes / 4;
      alignas(64) std::uint32_t block[lanes];
      for (index_t l = 0; l < lanes; ++l) block[l] = static_cast<std::uint32_t>(n * (l % 4) + l / 4);
      const U perm = U::load_aligned(block);
      // k0 is a multiple of lanes * chains (a power of two): no carry into the
      // high word. Only the low counter word differs between lanes, so the
      // first two rounds are half scalar: round 1 multiplies the uniform c2,
      // round 2 the c0 that round 1 made uniform.
      constexpr std::uint32_t m0 = 0xD2511F53u, m1 = 0xCD9E8D57u;  // PHILOX_M4x32_0, _1
      constexpr std::uint32_t w0 = 0x9E3779B9u, w1 = 0xBB67AE85u;  // PHILOX_W32_0, _1
      auto mulhilo32 = [](std::uint32_t a, std::uint32_t m, std::uint32_t& hi) {
        const std::uint64_t prod = static_cast<std::uint64_t>(a) * m;
        hi = static_cast<std::uint32_t>(prod >> 32);
        return static_cast<std::uint32_t>(prod);
      };
      std::uint32_t k_0 = static_cast<std::uint32_t>(key.seed);
      std::uint32_t k_1 = static_cast<std::uint32_t>(key.seed >> 32);
      const std::uint32_t s1 = static_cast<std::uint32_t>(k0 >> 32);
      const std::uint32_t s2 = static_cast<std::uint32_t>(key.step);
      const std::uint32_t s3 = key.tensor ^ static_cast<std::uint32_t>(key.step >> 32);
      // round 1: c0 = hi(m1 c2) ^ c1 ^ k0, c1 = lo(m1 c2) (uniform); c2 = hi(m0 c0) ^ c3 ^ k1, c3 = lo(m0 c0)
      std::uint32_t h1;
      const std::uint32_t l1 = mulhilo32(s2, m1, h1);
      const std::uint32_t u0 = h1 ^ s1 ^ k_0;
      const std::uint32_t u1 = l1;
      U c0[chains], c1[chains], c2[chains], c3[chains];
      for (int h = 0; h < chains; ++h) {
        const U ctr0 = U(static_cast<std::uint32_t>(k0) + static_cast<std::uint32_t>(h * lanes)) + perm;
        U hi0, lo0;
        Ops::mulhilo(ctr0, m0, hi0, lo0);
        c2[h] = hi0 ^ U(s3 ^ k_1);
        c3[h] = lo0;
      }
      // round 2: c0 = hi(m1 c2) ^ c1 ^ k0, c1 = lo(m1 c2); c2 = hi(m0 c0) ^ c3 ^ k1, c3 = lo(m0 c0) (uniform)
      k_0 += w0;
      k_1 += w1;
      std::uint32_t h0;
      const std::uint32_t l0 = mulhilo32(u0, m0, h0);
      for (int h = 0; h < chains; ++h) {
        U hi1, lo1;
        Ops::mulhilo(c2[h], m1, hi1, lo1);
        c0[h] = hi1 ^ U(u1 ^ k_0);
        c1[h] = lo1;
        c2[h] = c3[h] ^ U(h0 ^ k_1);
        c3[h] = U(l0);
      }
      for (int r = 2; r < 10; ++r) {
        k_0 += w0;
        k_1 += w1;
        for (int h = 0; h < chains; ++h) {
          U hi0, lo0, hi1, lo1;
          Ops::mulhilo(c0[h], m0, hi0, lo0);
          Ops::mulhilo(c2[h], m1, hi1, lo1);
          c0[h] = Ops::xor3(hi1, c1[h], U(k_0));
          c1[h] = lo1;
          c2[h] = Ops::xor3(hi0, c3[h], U(k_1));
          c3[h] = lo0;
        }
      }
      // Vector r of chain h holds, chunk by chunk, the four words of blocks
      // lanes h + n r + q (q < n); a block's eight elements take their low
      // halves, then their high halves: spread_halves() puts them in that
      // order, two vectors of elements per vector of words.
      for (int h = 0; h < chains; ++h) {
        Ops::transpose4(c0[h], c1[h], c2[h], c3[h]);
        const U* v[4] = {&c0[h], &c1[h], &c2[h], &c3[h]};
        for (index_t r = 0; r < 4; ++r) {
          U e0, e1;
          Ops::spread_halves(*v[r], e0, e1);
          std::uint32_t* o = out + elements_per_block * (lanes * h + n * r);
          e0.store_unaligned(o);
          e1.store_unaligned(o + lanes);
        }
      }
    } else {
      for (index_t b = 0; b < blocks; ++b) {
        const auto w = random_block(key, k0 + static_cast<std::uint64_t>(b));
        for (index_t k = 0; k < elements_per_block; ++k) out[8 * b + k] = block_bits(w, static_cast<std::uint64_t>(k));
      }
    }
  }
};

/// The random bits of a run of elements that a RandomWindow has generated:
/// elements [first, first + count), read without any check (see
/// RandomWindow::run).
struct RandomRun {
  const std::uint32_t* bits;  ///< the bits of element `first`
  index_t first;
  index_t count;
  SKEWADAM_ALWAYS_INLINE const std::uint32_t* at(index_t e, index_t /*count*/) const noexcept {
    return bits + (e - first);
  }
  SKEWADAM_ALWAYS_INLINE std::uint32_t operator()(index_t e) const noexcept { return bits[e - first]; }
};

/// Random bits for increasing element indices, buffered by windows of
/// PhiloxLanes::elements elements. The buffer keeps the last `lanes` values of
/// the previous window in front of the current one, so a request that
/// straddles two windows is still contiguous and moving on copies one vector.
template <class Arch>
class RandomWindow {
 public:
  static constexpr index_t window = PhiloxLanes<Arch>::elements;
  static constexpr index_t keep = PhiloxLanes<Arch>::lanes;

  explicit RandomWindow(const RoundingKey& key) noexcept : key_(key) {}

  /// Pointer to the bits of elements [e, e + count), count <= keep.
  SKEWADAM_ALWAYS_INLINE const std::uint32_t* at(index_t e, index_t count) noexcept {
    if (e + count > start_ + window || e < start_ - keep) [[unlikely]]
      refill(e, count);
    return buf_ + keep + (e - start_);
  }
  SKEWADAM_ALWAYS_INLINE std::uint32_t operator()(index_t e) noexcept { return *at(e, 1); }

  /// The bits of elements [e, e + count) (count <= keep) and of the elements
  /// after them that are buffered too, up to the window's end: a loop over
  /// increasing elements reads them without a check per vector, and calls
  /// run() again where the run ends.
  SKEWADAM_ALWAYS_INLINE RandomRun run(index_t e, index_t count) noexcept {
    const std::uint32_t* p = at(e, count);
    return RandomRun{p, e, start_ + window - e};
  }

 private:
  void refill(index_t e, index_t count) noexcept {
    const index_t last = e + count - 1;
    const index_t s = last - last % window;  // the window holding the last element
    if (s == start_ + window) {
      // moving on: keep the last values of the current window in front
      std::memcpy(buf_, buf_ + window, sizeof(std::uint32_t) * keep);
    } else if (e < s) {
      // a jump onto a window boundary: the front comes from the window before
      alignas(64) std::uint32_t prev[window];
      PhiloxLanes<Arch>::generate(key_, static_cast<std::uint64_t>((s - window) / elements_per_block), prev);
      std::memcpy(buf_, prev + window - keep, sizeof(std::uint32_t) * keep);
    }
    PhiloxLanes<Arch>::generate(key_, static_cast<std::uint64_t>(s / elements_per_block), buf_ + keep);
    start_ = s;
  }

  RoundingKey key_;
  index_t start_ = -8 * window;  // nothing buffered
  alignas(64) std::uint32_t buf_[keep + window];
};

}  // namespace skewadam::backend::cpu
