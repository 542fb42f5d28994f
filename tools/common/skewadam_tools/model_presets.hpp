#pragma once
// Built-in model inventories for skewadam-plan --preset.
//
// paper-6.78b: the model of the SkewAdam paper (docs/spec.md §6). GPT-2 BPE
// vocabulary padded to 50,304; d_model 4096; 256 learned positions; two
// blocks, block 0 with a dense SwiGLU FFN (ff 4096), block 1 with an MoE of
// 128 SwiGLU experts (ff 4096; w1, w2, w3 of [4096, 4096] each, stored per
// expert as in the paper) and a top-2 router [128, 4096]; grouped-query
// attention with 32 query and 8 KV heads of 128 (q and out [4096, 4096],
// k and v [1024, 4096]); LayerNorm (weight and bias) before attention, before
// the FFN and at the end; no biases on linear layers; the LM head is tied to
// the token embedding, so it is not a separate tensor. Weights are bf16
// except the LayerNorms and the router, which are fp32.

#include <string>
#include <string_view>
#include <vector>

#include <skewadam/types/dtype.hpp>
#include <skewadam/plan.hpp>
#include <skewadam/types/shape.hpp>

namespace skewadam::tools {

struct Preset {
  std::string_view name;
  std::string_view description;
};

inline constexpr Preset presets[] = {
    {"paper-6.78b", "the SkewAdam paper's 6.78B-parameter MoE (2 blocks, 128 experts; docs/spec.md section 6)"},
};

namespace detail {

inline std::vector<TensorSpec> paper_6_78b() {
  constexpr index_t vocab = 50'304, d = 4096, positions = 256, ff = 4096, experts = 128;
  constexpr index_t kv = 8 * 128;  // 8 KV heads of 128
  std::vector<TensorSpec> t;
  auto add = [&t](std::string name, Shape shape, Dtype dtype) {
    t.push_back(TensorSpec{std::move(name), shape, dtype});
  };
  auto layer_norm = [&](const std::string& prefix) {
    add(prefix + ".weight", Shape{d}, Dtype::f32);
    add(prefix + ".bias", Shape{d}, Dtype::f32);
  };
  add("tok_emb.weight", Shape{vocab, d}, Dtype::bf16);
  add("pos_emb.weight", Shape{positions, d}, Dtype::bf16);
  for (int b = 0; b < 2; ++b) {
    const std::string block = "blocks." + std::to_string(b);
    layer_norm(block + ".ln1");
    add(block + ".attn.q.weight", Shape{d, d}, Dtype::bf16);
    add(block + ".attn.k.weight", Shape{kv, d}, Dtype::bf16);
    add(block + ".attn.v.weight", Shape{kv, d}, Dtype::bf16);
    add(block + ".attn.out.weight", Shape{d, d}, Dtype::bf16);
    layer_norm(block + ".ln2");
    if (b == 0) {
      add(block + ".ffn.w1.weight", Shape{ff, d}, Dtype::bf16);
      add(block + ".ffn.w2.weight", Shape{d, ff}, Dtype::bf16);
      add(block + ".ffn.w3.weight", Shape{ff, d}, Dtype::bf16);
    } else {
      add(block + ".moe.router.weight", Shape{experts, d}, Dtype::f32);
      for (index_t e = 0; e < experts; ++e) {
        const std::string expert = block + ".moe.experts." + std::to_string(e);
        add(expert + ".w1.weight", Shape{ff, d}, Dtype::bf16);
        add(expert + ".w2.weight", Shape{d, ff}, Dtype::bf16);
        add(expert + ".w3.weight", Shape{ff, d}, Dtype::bf16);
      }
    }
  }
  layer_norm("ln_f");
  return t;
}

}  // namespace detail

/// The inventory of preset `name`; throws std::invalid_argument naming
/// `argument` and the available presets when there is no such preset.
inline std::vector<TensorSpec> preset_inventory(std::string_view name, std::string_view argument = "preset") {
  if (name == "paper-6.78b") return detail::paper_6_78b();
  std::string known;
  for (const Preset& p : presets) known += (known.empty() ? "" : ", ") + std::string(p.name);
  throw std::invalid_argument(std::string(argument) + ": unknown preset '" + std::string(name) +
                              "' (available: " + known + ")");
}

}  // namespace skewadam::tools
