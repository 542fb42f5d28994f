#pragma once
// Tensor shapes: rank 1 to max_rank, 64-bit extents, C (row-major) order.

#include <array>
#include <cstddef>
#include <initializer_list>
#include <stdexcept>
#include <string>
#include <string_view>

#include "../detail/config.hpp"

namespace skewadam {

inline constexpr int max_rank = 8;

/// How a tensor is seen by a factored second moment: B matrices of r x c,
/// the last two dimensions. A rank-1 tensor is one 1 x n matrix.
struct MatrixGeometry {
  index_t batch = 0;  ///< B = d0 * ... * d(k-3); 1 for a matrix
  index_t rows = 0;   ///< r, the second-to-last dimension (1 for rank 1)
  index_t cols = 0;   ///< c, the last dimension
  SKEWADAM_HD constexpr index_t matrix_size() const noexcept { return rows * cols; }
  SKEWADAM_HD constexpr index_t numel() const noexcept { return batch * rows * cols; }
};

/// A small, trivially copyable shape. Extents must be >= 0; a zero extent
/// makes an empty tensor, which every operation treats as a no-op.
class Shape {
 public:
  constexpr Shape() = default;

  Shape(std::initializer_list<index_t> dims, std::string_view argument = "shape") {
    assign(dims.begin(), static_cast<index_t>(dims.size()), argument);
  }

  template <class It>
  Shape(It first, index_t count, std::string_view argument = "shape") {
    assign(first, count, argument);
  }

  constexpr int rank() const noexcept { return rank_; }
  constexpr index_t operator[](int i) const noexcept { return dims_[static_cast<std::size_t>(i)]; }
  constexpr const index_t* begin() const noexcept { return dims_.data(); }
  constexpr const index_t* end() const noexcept { return dims_.data() + rank_; }

  constexpr index_t numel() const noexcept {
    if (rank_ == 0) return 0;
    index_t n = 1;
    for (int i = 0; i < rank_; ++i) n *= dims_[static_cast<std::size_t>(i)];
    return n;
  }

  constexpr MatrixGeometry matrices() const noexcept {
    MatrixGeometry g;
    if (rank_ == 0) return g;
    g.cols = dims_[static_cast<std::size_t>(rank_ - 1)];
    g.rows = rank_ >= 2 ? dims_[static_cast<std::size_t>(rank_ - 2)] : 1;
    g.batch = 1;
    for (int i = 0; i + 2 < rank_; ++i) g.batch *= dims_[static_cast<std::size_t>(i)];
    return g;
  }

  friend constexpr bool operator==(const Shape& a, const Shape& b) noexcept {
    if (a.rank_ != b.rank_) return false;
    for (int i = 0; i < a.rank_; ++i)
      if (a.dims_[static_cast<std::size_t>(i)] != b.dims_[static_cast<std::size_t>(i)]) return false;
    return true;
  }

  std::string str() const {
    std::string s = "[";
    for (int i = 0; i < rank_; ++i) {
      if (i) s += ", ";
      s += std::to_string(dims_[static_cast<std::size_t>(i)]);
    }
    return s + "]";
  }

 private:
  template <class It>
  void assign(It first, index_t count, std::string_view argument) {
    if (count < 1 || count > max_rank)
      throw std::invalid_argument(std::string(argument) + ": rank " + std::to_string(count) +
                                  " is outside 1.." + std::to_string(max_rank));
    constexpr index_t limit = index_t{1} << 62;
    index_t n = 1;
    for (index_t i = 0; i < count; ++i, ++first) {
      const index_t d = static_cast<index_t>(*first);
      if (d < 0)
        throw std::invalid_argument(std::string(argument) + ": dimension " + std::to_string(i) +
                                    " is negative (" + std::to_string(d) + ")");
      if (d > 0 && n > limit / d)
        throw std::invalid_argument(std::string(argument) + ": element count overflows 2^62");
      n *= d;
      dims_[static_cast<std::size_t>(i)] = d;
    }
    rank_ = static_cast<int>(count);
  }

  std::array<index_t, max_rank> dims_{};
  int rank_ = 0;
};

}  // namespace skewadam
