#pragma once
// The parameter sets both benchmarks time (bench/skewadam_bench.cpp on the
// CPU, bench/skewadam_cuda_bench.cu on the GPU): which rule a tensor is
// stepped with, and the set with the paper's proportions. Each benchmark
// keeps its own traffic model beside its timing.

#include <string>
#include <vector>

#include <skewadam/types/dtype.hpp>
#include <skewadam/types/shape.hpp>
#include <skewadam/types/tier.hpp>

namespace skewadam_bench {

/// The rule a benchmark steps a tensor with: a SkewAdam tier, or AdamW.
enum class Kind { backbone, experts, router, adamw };

inline const char* kind_name(Kind k) {
  switch (k) {
    case Kind::backbone: return "backbone";
    case Kind::experts: return "experts";
    case Kind::router: return "router";
    case Kind::adamw: return "adamw";
  }
  return "?";
}

/// The tier a tensor is registered under (AdamW: every tier runs AdamW).
inline skewadam::Tier tier_of(Kind k) {
  return k == Kind::experts ? skewadam::Tier::experts
         : k == Kind::router ? skewadam::Tier::router
                             : skewadam::Tier::backbone;
}

struct Param {
  std::string name;
  Kind kind;
  skewadam::Shape shape;
  skewadam::Dtype dtype;
};

/// The paper's proportions (docs/spec.md §1: 5 % backbone, 95 % experts, a
/// router) at d_model 1024 with 8 experts of ff 2048: 52.97 M parameters,
/// backbone 4.96 %, experts 95.02 %, router 0.015 %. Matrix weights in
/// `dtype`; LayerNorms and the router in fp32 (as the paper keeps them).
/// `adamw`: the same tensors, all stepped with AdamW. bench/compare.py
/// builds the same set.
inline std::vector<Param> paper_model(skewadam::Dtype dtype, bool adamw) {
  using skewadam::Dtype;
  using skewadam::index_t;
  using skewadam::Shape;
  const index_t d = 1024, e = 8, ff = 2048, kv = 256;
  auto kind = [&](Kind k) { return adamw ? Kind::adamw : k; };
  std::vector<Param> ps;
  for (const char* n : {"ln1.weight", "ln1.bias", "ln2.weight", "ln2.bias", "lnf.weight", "lnf.bias"})
    ps.push_back({n, kind(Kind::backbone), Shape{d}, Dtype::f32});
  ps.push_back({"attn.q", kind(Kind::backbone), Shape{d, d}, dtype});
  ps.push_back({"attn.k", kind(Kind::backbone), Shape{kv, d}, dtype});
  ps.push_back({"attn.v", kind(Kind::backbone), Shape{kv, d}, dtype});
  ps.push_back({"attn.o", kind(Kind::backbone), Shape{d, d}, dtype});
  ps.push_back({"moe.router", kind(Kind::router), Shape{e, d}, Dtype::f32});
  ps.push_back({"moe.w1", kind(Kind::experts), Shape{e, ff, d}, dtype});
  ps.push_back({"moe.w3", kind(Kind::experts), Shape{e, ff, d}, dtype});
  ps.push_back({"moe.w2", kind(Kind::experts), Shape{e, d, ff}, dtype});
  return ps;
}

}  // namespace skewadam_bench
