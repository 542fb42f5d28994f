#pragma once
// decode_momentum: a tensor's first moment as fp32 values, whatever its
// storage (state_layout.hpp): the words of a momentum stored in bf16 or 8
// bits decoded as the policies decode them (policies/bf16_momentum.hpp,
// policies/float8_block_momentum.hpp, policies/int8_block_momentum.hpp),
// fp32 momentum copied. For reading a
// checkpoint's or an export's m, comparing runs, and the conformance cases'
// exp_avg.

#include <cstdint>
#include <cstring>
#include <span>
#include <stdexcept>
#include <string>
#include <vector>

#include "../detail/config.hpp"
#include "../policies/bf16_momentum.hpp"
#include "../policies/float8_block_momentum.hpp"
#include "../policies/int8_block_momentum.hpp"
#include "../state/state_layout.hpp"
#include "../types/dtype.hpp"
#include "../types/shape.hpp"

namespace skewadam {

/// The numel values of the momentum of B matrices of r x c (`g`) stored as
/// `storage` in `words`, in C order. Throws std::invalid_argument when
/// `words` does not hold momentum_words() words.
inline std::vector<float> decode_momentum(MomentumStorage storage, const MatrixGeometry& g,
                                          std::span<const float> words) {
  const index_t want = momentum_words(StateLayout{true, false, storage}, g);
  if (static_cast<index_t>(words.size()) != want)
    throw std::invalid_argument("momentum: " + std::to_string(words.size()) + " words, expected " +
                                std::to_string(want) + " for " + std::to_string(g.numel()) + " elements");
  const index_t size = g.matrix_size();
  std::vector<float> out(static_cast<std::size_t>(g.numel()));
  if (storage == MomentumStorage::f32) {
    if (!words.empty()) std::memcpy(out.data(), words.data(), 4 * words.size());
    return out;
  }
  const auto* bytes = reinterpret_cast<const unsigned char*>(words.data());
  for (index_t b = 0; b < g.batch; ++b)
    for (index_t e = 0; e < size; ++e) {
      const index_t word = momentum_word_at(storage, size, b, e);
      const index_t r = e % momentum_block;
      float& x = out[static_cast<std::size_t>(b * size + e)];
      if (storage == MomentumStorage::bfloat16) {
        std::uint16_t h;
        std::memcpy(&h, bytes + 4 * word + 2 * r, 2);
        x = Bf16Momentum::decode(from_bits<bf16>(h));
      } else {
        float scale;
        std::memcpy(&scale, bytes + 4 * word, 4);
        const std::uint32_t q = bytes[4 * (word + 1) + r];
        x = storage == MomentumStorage::float8_blocks ? Float8BlockMomentum::decode(q, scale)
                                                      : Int8BlockMomentum::decode(q, scale);
      }
    }
  return out;
}

}  // namespace skewadam
