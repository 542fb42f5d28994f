#pragma once
// Counter-based random bits for stochastic rounding (docs/spec.md §4, extension E1).
//
// Philox4x32-10 (Random123) keyed by (seed), counted by (element / 8, step,
// tensor): the bits an element gets depend only on (seed, step, tensor id,
// element index), never on threads, chunking or backend, so CPU and CUDA
// produce the same bf16 bits and a resumed run repeats an uninterrupted one.
//
// Rounding to bf16 needs 16 random bits per element (fp16: 13 in its normal
// range), so one Philox block of four 32-bit words serves eight elements:
// element e of block k = e / 8 takes the low half of word (e mod 4) when
// e mod 8 < 4 and its high half otherwise. (Checkpoints name this stream's
// rounding policy StochasticRounding16: see rule_name.hpp.)

// Random123's SSE types (r123m128i and the arrays of them) are not used here:
// unless the includer configured Random123 first, they are left out
// (R123_USE_SSE 0, Random123's own switch, which then holds for its other
// headers too), which spares every file that includes skewadam the whole of
// <x86intrin.h> (about a second of compile time without -march). Philox4x32
// is the same either way.
#if !defined(R123_USE_SSE)
#define R123_USE_SSE 0
#endif
#include <Random123/philox.h>

#include <cstdint>
#include <string_view>

#include "../detail/config.hpp"

namespace skewadam {

/// Identifies one tensor's rounding stream for one step.
struct RoundingKey {
  std::uint64_t seed = 0;
  std::uint32_t tensor = 0;  ///< stable id of the tensor (hash of its name)
  std::uint64_t step = 0;
};

/// FNV-1a of a parameter name: a tensor id that does not depend on
/// registration order or on how tensors are sharded.
constexpr std::uint32_t tensor_id(std::string_view name) noexcept {
  std::uint32_t h = 2166136261u;
  for (char ch : name) {
    h ^= static_cast<unsigned char>(ch);
    h *= 16777619u;
  }
  return h;
}

/// Elements served by one Philox block.
inline constexpr index_t elements_per_block = 8;

/// The four 32-bit words of Philox block k: the bits of elements [8k, 8k + 8)
/// of a tensor.
SKEWADAM_HD inline r123::Philox4x32::ctr_type random_block(const RoundingKey& key, std::uint64_t k) {
  r123::Philox4x32 gen;
  r123::Philox4x32::ctr_type ctr = {{static_cast<std::uint32_t>(k), static_cast<std::uint32_t>(k >> 32),
                                     static_cast<std::uint32_t>(key.step),
                                     key.tensor ^ static_cast<std::uint32_t>(key.step >> 32)}};
  r123::Philox4x32::key_type k2 = {{static_cast<std::uint32_t>(key.seed),
                                    static_cast<std::uint32_t>(key.seed >> 32)}};
  return gen(ctr, k2);
}

/// Element e's 16 random bits (in the low half of the result) from the words
/// of its block (random_block(key, e / 8)).
SKEWADAM_HD inline std::uint32_t block_bits(const r123::Philox4x32::ctr_type& block, std::uint64_t e) {
  const std::uint32_t word = block.v[e & 3u];
  return (e & 4u) ? word >> 16 : word & 0xffffu;
}

/// The 16 random bits of one element, in [0, 2^16).
SKEWADAM_HD inline std::uint32_t random_bits(const RoundingKey& key, index_t element) {
  const auto e = static_cast<std::uint64_t>(element);
  return block_bits(random_block(key, e >> 3), e);
}

/// Sequential access to an element range, one Philox call per 8 elements.
class RandomStream {
 public:
  SKEWADAM_HD explicit RandomStream(const RoundingKey& key) : key_(key) {}
  SKEWADAM_HD std::uint32_t operator()(index_t element) {
    const auto e = static_cast<std::uint64_t>(element);
    const std::uint64_t k = e >> 3;
    if (k != block_index_ || !valid_) {
      block_ = random_block(key_, k);
      block_index_ = k;
      valid_ = true;
    }
    return block_bits(block_, e);
  }

 private:
  RoundingKey key_;
  r123::Philox4x32::ctr_type block_{};
  std::uint64_t block_index_ = 0;
  bool valid_ = false;
};

}  // namespace skewadam
