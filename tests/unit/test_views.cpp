// Shapes, views and Eigen views.

#include <doctest/doctest.h>

#include <utility>

#include <skewadam/eigen_view.hpp>
#include <skewadam/skewadam.hpp>

namespace test_views {

using namespace skewadam;

TEST_CASE("shape geometry: the last two dimensions are the matrix") {
  const MatrixGeometry g = Shape{2, 3, 4, 5}.matrices();
  CHECK(g.batch == 6);
  CHECK(g.rows == 4);
  CHECK(g.cols == 5);
  const MatrixGeometry v = Shape{7}.matrices();
  CHECK(v.batch == 1);
  CHECK(v.rows == 1);
  CHECK(v.cols == 7);
  CHECK(Shape{3, 0}.numel() == 0);
  CHECK(Shape{3, 4}.str() == "[3, 4]");
  CHECK(Shape{3, 4} == Shape{3, 4});
  CHECK_FALSE(Shape{3, 4} == Shape{4, 3});
}

TEST_CASE("64-bit sizes") {
  const Shape s{129, 4096, 4096};
  CHECK(s.numel() == index_t{129} * 4096 * 4096);
  CHECK(s.numel() > (index_t{1} << 31));
  CHECK(state_bytes(layouts::experts, s) == 4 * 129 * (4096 + 4096));
  CHECK_THROWS_WITH_AS((Shape{index_t{1} << 40, index_t{1} << 40}), doctest::Contains("overflows"), std::invalid_argument);
  CHECK_THROWS_WITH_AS((Shape{1, 2, 3, 4, 5, 6, 7, 8, 9}), doctest::Contains("rank 9"), std::invalid_argument);
}

TEST_CASE("views from raw pointers") {
  std::vector<float> w(12);
  const TensorView<float> v(w.data(), {3, 4});
  const TensorView<const float> c = v;  // mutable converts to const
  CHECK(c.data() == w.data());
  CHECK(v.numel() == 12);
  const ParamView p = v;
  CHECK(p.dtype == Dtype::f32);
  CHECK(p.bytes() == 48);
  std::vector<bf16> h(6);
  const GradView g = TensorView<const bf16>(h.data(), {2, 3});
  CHECK(g.dtype == Dtype::bf16);
  CHECK(g.present());
  CHECK_FALSE(GradView{}.present());
}

TEST_CASE("views from Eigen") {
  using RowMajor = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
  RowMajor w = RowMajor::Random(6, 5);
  RowMajor g = RowMajor::Random(6, 5);
  const auto wv = eigen_view(w);
  static_assert(std::is_same_v<decltype(wv), const TensorView<float>>);
  const auto gv = eigen_view(std::as_const(g));
  static_assert(std::is_same_v<decltype(gv), const TensorView<const float>>);
  CHECK(wv.shape() == Shape{6, 5});
  Eigen::Map<const RowMajor> gm(g.data(), 6, 5);
  static_assert(std::is_same_v<decltype(eigen_view(gm)), TensorView<const float>>);
  Eigen::Ref<RowMajor> wr(w);
  static_assert(std::is_same_v<decltype(eigen_view(wr)), TensorView<float>>);
  Eigen::VectorXf b = Eigen::VectorXf::Random(5);
  CHECK(eigen_view(b).shape() == Shape{5});

  SkewAdam opt;
  opt.add("w", Tier::backbone, eigen_view(w), eigen_view(std::as_const(g)));
  const RowMajor before = w;
  opt.step();
  CHECK((w - before).norm() > 0);

  Eigen::Map<RowMajor, 0, Eigen::OuterStride<>> strided(w.data(), 3, 5, Eigen::OuterStride<>(10));
  CHECK_THROWS_WITH_AS(eigen_view(strided, "w"), doctest::Contains("w: Eigen object is not contiguous"),
                       std::invalid_argument);
}

}  // namespace test_views
