// The reference of bench/compile_cost.py: a file of comparable purpose to the
// README's usage example (a few tensors, one numerical operation on them,
// a check of the result), written with Eigen.
#include <Eigen/Dense>

int main() {
  Eigen::MatrixXf a = Eigen::MatrixXf::Random(256, 64);
  Eigen::MatrixXf b = Eigen::MatrixXf::Random(64, 128);
  Eigen::MatrixXf c = a * b;
  return c.allFinite() ? 0 : 1;
}
