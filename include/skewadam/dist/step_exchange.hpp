#pragma once
// The exchanges of a sharded step that do not depend on the backend
// (placement/sharded.hpp on the CPU, placement/sharded_cuda.hpp on the GPU):
//
//   mark_stepped, sum_over_ranks
//                     which tensors a step has; a value summed over ranks
//   agree_on_step     step 0: the ranks check that they step the same
//                     tensors, and learn the first offending gradient of any
//                     rank (lowest tensor, then element)
//   clip_divisors     step 3: every clipped tensor's divisors, from its
//                     pieces' sums of u^2, summed over ranks where its clip
//                     scope spans ranks
//
// Both are all-gathers whose parts every rank combines in rank order, so all
// ranks reach the same answer bit for bit.

#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <stdexcept>
#include <string>
#include <vector>

#include "../config.hpp"
#include "../engine.hpp"
#include "communicator.hpp"
#include "shard_plan.hpp"

namespace skewadam::dist {

/// Points each stepped tensor's entry at its item (every other entry's
/// `item` at null) and lists the stepped tensors in item order.
template <class Entry>
void mark_stepped(std::vector<Entry>& entries, std::span<const StepItem> items, std::vector<std::size_t>& stepped) {
  for (Entry& e : entries) e.item = nullptr;
  stepped.clear();
  for (const StepItem& it : items) {
    entries[static_cast<std::size_t>(it.index)].item = &it;
    stepped.push_back(static_cast<std::size_t>(it.index));
  }
}

/// The sum of every rank's `mine`, added in rank order (collective).
template <Communicator Comm>
double sum_over_ranks(Comm& comm, double mine) {
  std::vector<double> room;
  ordered_sum(comm, std::span<double>(&mine, 1), room);
  return mine;
}

/// Step 0 (collective): throws std::invalid_argument unless every rank steps
/// the tensors `stepped`; returns the first offender over all ranks, given
/// this rank's first (`mine`). Adds the bytes it sent to `bytes`.
template <Communicator Comm>
std::optional<Offender> agree_on_step(Comm& comm, std::span<const std::size_t> stepped,
                                      const std::optional<Offender>& mine, index_t& bytes) {
  struct Check {
    std::uint64_t stepped = 0;  ///< FNV-1a of the stepped tensors' indices
    std::int64_t param = -1;    ///< first offending tensor, or -1
    std::int64_t element = -1;
    float value = 0;
    float pad = 0;
  };
  Check c;
  std::uint64_t h = 14695981039346656037ull;
  for (std::size_t i : stepped) {
    h ^= static_cast<std::uint64_t>(i) + 1;
    h *= 1099511628211ull;
  }
  c.stepped = h;
  if (mine) {
    c.param = static_cast<std::int64_t>(mine->index);
    c.element = static_cast<std::int64_t>(mine->element);
    c.value = mine->value;
  }
  std::vector<Check> all(static_cast<std::size_t>(comm.size()));
  comm.all_gather(std::as_bytes(std::span<const Check>(&c, 1)), std::as_writable_bytes(std::span<Check>(all)));
  bytes += static_cast<index_t>(sizeof(Check));
  for (std::size_t k = 0; k < all.size(); ++k)
    if (all[k].stepped != all[0].stepped)
      throw std::invalid_argument("step: rank " + std::to_string(k) +
                                  " has gradients for a different set of parameters than rank 0 (every rank "
                                  "must set the same gradients before a step)");
  const Check* first = nullptr;
  for (const Check& x : all) {
    if (x.param < 0) continue;
    if (!first || x.param < first->param || (x.param == first->param && x.element < first->element)) first = &x;
  }
  if (!first) return std::nullopt;
  return Offender{first->param, first->element, first->value};
}

/// What clip_divisors asks of the placement about stepped tensor i:
///   clips(i) -> bool              its rule clips
///   split(i) -> const TensorSplit&
///   per_matrix(i) -> bool         its clip scope is each matrix
///   pieces(i) -> std::size_t      how many pieces this rank owns
///   matrix(i, q) -> index_t       the matrix piece q belongs to
///   sum_u2(i, q) -> double        piece q's sum of u^2
///   divisor(i, sum, count) -> float   the rule's divisor of `sum` over `count` elements
///   set_divisor(i, q, div)
/// Scratch vectors are reused between steps.
struct ClipScratch {
  std::vector<double> out, in, sums;
};

/// Step 3 (collective): every clipped tensor's divisors. Returns the bytes sent.
template <Communicator Comm, class Tensors>
index_t clip_divisors(Comm& comm, std::span<const std::size_t> stepped, Tensors& t, ClipScratch& x) {
  index_t bytes = 0;
  x.out.clear();
  for (std::size_t i : stepped) {
    const TensorSplit& split = t.split(i);
    if (exchange_bytes(split, t.clips(i), t.per_matrix(i)).clip == 0) continue;
    const std::size_t at = x.out.size();
    x.out.resize(at + static_cast<std::size_t>(split.geom.batch), 0.0);
    for (std::size_t q = 0; q < t.pieces(i); ++q) x.out[at + static_cast<std::size_t>(t.matrix(i, q))] = t.sum_u2(i, q);
  }
  const auto ranks = static_cast<std::size_t>(comm.size());
  x.in.resize(x.out.size() * ranks);
  if (!x.out.empty()) {
    comm.all_gather(std::as_bytes(std::span<const double>(x.out)), std::as_writable_bytes(std::span<double>(x.in)));
    bytes += static_cast<index_t>(8 * x.out.size());
  }

  std::size_t at = 0;
  const std::size_t stride = x.out.size();
  for (std::size_t i : stepped) {
    if (!t.clips(i)) continue;
    const TensorSplit& split = t.split(i);
    const bool per_matrix = t.per_matrix(i);
    const MatrixGeometry& g = split.geom;
    x.sums.assign(static_cast<std::size_t>(g.batch), 0.0);
    if (exchange_bytes(split, true, per_matrix).clip > 0) {
      for (index_t b = 0; b < g.batch; ++b) {
        double v = x.in[at + static_cast<std::size_t>(b)];
        for (std::size_t r = 1; r < ranks; ++r) v += x.in[r * stride + at + static_cast<std::size_t>(b)];
        x.sums[static_cast<std::size_t>(b)] = v;
      }
      at += static_cast<std::size_t>(g.batch);
    } else {
      for (std::size_t q = 0; q < t.pieces(i); ++q) x.sums[static_cast<std::size_t>(t.matrix(i, q))] = t.sum_u2(i, q);
    }
    if (per_matrix) {
      for (std::size_t q = 0; q < t.pieces(i); ++q)
        t.set_divisor(i, q, t.divisor(i, x.sums[static_cast<std::size_t>(t.matrix(i, q))], g.matrix_size()));
    } else {
      double total = 0;
      for (double v : x.sums) total += v;
      const float div = t.divisor(i, total, g.numel());
      for (std::size_t q = 0; q < t.pieces(i); ++q) t.set_divisor(i, q, div);
    }
  }
  return bytes;
}

}  // namespace skewadam::dist
