#pragma once
// A decoder-only Mixture-of-Experts language model in LibTorch.
//
//   tokens -> token embedding + learned position embedding
//   blocks: pre-LayerNorm causal self-attention (grouped-query when kv_heads
//           < heads), then a feed-forward layer: a dense SwiGLU in even
//           blocks, a Mixture of SwiGLU experts with a top-k router and a
//           load-balancing loss in odd blocks
//   final LayerNorm -> LM head tied to the token embedding
//
// Parameter names follow the usual MoE checkpoints, so that skewadam's
// default tier rules apply unchanged:
//   blocks.1.moe.router.weight                 [E, d]         -> router
//   blocks.1.moe.experts.gate_proj             [E, d, ff]     -> experts (stacked bank)
//   blocks.1.moe.experts.up_proj               [E, d, ff]     -> experts
//   blocks.1.moe.experts.down_proj             [E, ff, d]     -> experts
//   blocks.1.moe.experts.7.gate_proj           [d, ff]        -> experts (ModelConfig::separate_experts:
//                                                                one tensor per expert, as the paper's)
//   blocks.0.ffn.gate_proj.weight              [ff, d]        -> backbone (a dense FFN's gate_proj)
//   tok_emb.weight, pos_emb.weight, blocks.*.attn.*, *.ln*.*  -> backbone
//
// Parameters are created where they will live (ModelConfig::device, the
// "meta" device included, where nothing is allocated) in ModelConfig::dtype,
// except the LayerNorms and the router, which stay fp32 as in the paper's
// model (docs/spec.md §6). Each layer computes in its weights' dtype.

#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <stdexcept>
#include <string>
#include <vector>

namespace moe_lm {

struct ModelConfig {
  std::int64_t vocab = 256;      ///< byte-level tokens (a larger table only adds rows)
  std::int64_t d_model = 128;
  std::int64_t heads = 4;
  std::int64_t kv_heads = 0;     ///< key/value heads (grouped-query attention); 0: heads
  std::int64_t context = 128;    ///< longest sequence (learned positions)
  std::int64_t layers = 2;       ///< blocks; odd ones are MoE
  std::int64_t dense_ff = 192;   ///< hidden width of the dense SwiGLU
  std::int64_t experts = 16;     ///< experts per MoE layer
  std::int64_t expert_ff = 768;  ///< hidden width of each expert
  std::int64_t top_k = 2;
  torch::ScalarType dtype = torch::kFloat;  ///< weights (LayerNorms and routers: fp32)
  /// Each expert's matrices as tensors of their own instead of stacked banks:
  /// then each expert's gradient is complete, and can be stepped and freed,
  /// as soon as its part of backward ends (a bank's gradient is formed whole).
  bool separate_experts = false;
  /// Activation checkpointing: each block keeps only its input for backward
  /// and runs its forward again there (a reentrant segment, so that each
  /// parameter's gradient is still complete, stepped and freed on its own),
  /// and the LM head's loss is formed in chunks of head_chunk tokens, each
  /// recomputed in backward: the memory of activations no longer grows with
  /// the tokens of a step beyond one block's.
  bool checkpoint = false;
  std::int64_t head_chunk = 512;
  torch::Device device = torch::kCPU;

  std::int64_t key_value_heads() const { return kv_heads == 0 ? heads : kv_heads; }

  void validate() const {
    auto positive = [](std::int64_t v, const char* what) {
      if (v <= 0) throw std::invalid_argument(std::string("ModelConfig.") + what + " must be > 0");
    };
    positive(vocab, "vocab");
    positive(d_model, "d_model");
    positive(heads, "heads");
    positive(context, "context");
    positive(layers, "layers");
    positive(dense_ff, "dense_ff");
    positive(experts, "experts");
    positive(expert_ff, "expert_ff");
    positive(top_k, "top_k");
    positive(head_chunk, "head_chunk");
    if (kv_heads < 0) throw std::invalid_argument("ModelConfig.kv_heads must be >= 0");
    if (d_model % heads != 0) throw std::invalid_argument("ModelConfig.d_model must be a multiple of heads");
    if (heads % key_value_heads() != 0) throw std::invalid_argument("ModelConfig.heads must be a multiple of kv_heads");
    if (top_k > experts) throw std::invalid_argument("ModelConfig.top_k must not exceed experts");
    if (dtype != torch::kFloat && dtype != torch::kBFloat16 && dtype != torch::kHalf)
      throw std::invalid_argument("ModelConfig.dtype must be float32, bfloat16 or float16");
  }
};

inline constexpr double init_std = 0.02;

/// A new parameter on `options`' device and dtype, drawn from N(0, std).
/// A 16-bit one is drawn in fp32, a slice of its first dimension at a time,
/// and rounded: torch's normal_ on bf16 CPU tensors is several times slower,
/// which for the paper's model is minutes of its start.
inline torch::Tensor normal_parameter(torch::IntArrayRef shape, const torch::TensorOptions& options, double std) {
  torch::NoGradGuard no_grad;
  torch::Tensor t = torch::empty(shape, options);
  if (options.dtype() == torch::kFloat || t.device().is_meta() || t.dim() == 0) return t.normal_(0.0, std);
  const std::int64_t slice = std::max<std::int64_t>(1, t.numel() / std::max<std::int64_t>(1, t.size(0)));
  const std::int64_t step = std::max<std::int64_t>(1, (std::int64_t{1} << 22) / slice);  // about 16 MiB of fp32
  for (std::int64_t i = 0; i < t.size(0); i += step) {
    torch::Tensor part = t.narrow(0, i, std::min(step, t.size(0) - i));
    part.copy_(torch::empty(part.sizes(), options.dtype(torch::kFloat)).normal_(0.0, std));
  }
  return t;
}

/// y = x W^T, no bias; W [out, in].
class DenseImpl : public torch::nn::Module {
 public:
  DenseImpl(std::int64_t in, std::int64_t out, const torch::TensorOptions& options, double std)
      : weight(register_parameter("weight", normal_parameter({out, in}, options, std))) {}
  torch::Tensor forward(const torch::Tensor& x) {
    return torch::nn::functional::linear(x.to(weight.scalar_type()), weight);
  }
  torch::Tensor weight;
};
TORCH_MODULE(Dense);

/// A lookup table [n, d].
class EmbeddingTableImpl : public torch::nn::Module {
 public:
  EmbeddingTableImpl(std::int64_t n, std::int64_t d, const torch::TensorOptions& options)
      : weight(register_parameter("weight", normal_parameter({n, d}, options, init_std))) {}
  torch::Tensor forward(const torch::Tensor& idx) { return torch::embedding(weight, idx); }
  torch::Tensor weight;
};
TORCH_MODULE(EmbeddingTable);

/// LayerNorm with weight and bias, computed in its parameters' dtype (fp32
/// unless the module was converted); returns the input's dtype.
class NormImpl : public torch::nn::Module {
 public:
  NormImpl(std::int64_t d, torch::Device device)
      : weight(register_parameter("weight", torch::ones({d}, torch::TensorOptions().device(device)))),
        bias(register_parameter("bias", torch::zeros({d}, torch::TensorOptions().device(device)))) {}
  torch::Tensor forward(const torch::Tensor& x) {
    return torch::layer_norm(x.to(weight.scalar_type()), {weight.size(0)}, weight, bias).to(x.scalar_type());
  }
  torch::Tensor weight, bias;
};
TORCH_MODULE(Norm);

/// Causal self-attention; heads/kv_heads query heads share each key/value
/// head. One projection `qkv` of [(heads + 2 kv_heads) * head_dim, d].
class CausalSelfAttentionImpl : public torch::nn::Module {
 public:
  CausalSelfAttentionImpl(const ModelConfig& c, const torch::TensorOptions& options, double out_std)
      : heads_(c.heads),
        kv_heads_(c.key_value_heads()),
        qkv(register_module("qkv", Dense(c.d_model, c.d_model + 2 * c.key_value_heads() * (c.d_model / c.heads),
                                         options, init_std))),
        out(register_module("out", Dense(c.d_model, c.d_model, options, out_std))) {}

  torch::Tensor forward(const torch::Tensor& x) {
    const auto b = x.size(0), t = x.size(1), d = x.size(2), hd = d / heads_;
    const auto parts = qkv->forward(x).split({heads_ * hd, kv_heads_ * hd, kv_heads_ * hd}, -1);
    const auto q = parts[0].view({b, t, heads_, hd}).transpose(1, 2);  // [B, H, T, hd]
    auto k = parts[1].view({b, t, kv_heads_, hd}).transpose(1, 2);      // [B, KV, T, hd]
    auto v = parts[2].view({b, t, kv_heads_, hd}).transpose(1, 2);
    if (kv_heads_ != heads_) {
      k = k.repeat_interleave(heads_ / kv_heads_, 1);
      v = v.repeat_interleave(heads_ / kv_heads_, 1);
    }
    auto scores = torch::matmul(q, k.transpose(-2, -1)) * (1.0 / std::sqrt(static_cast<double>(hd)));
    const auto future = torch::ones({t, t}, x.options().dtype(torch::kBool)).triu(1);
    scores = scores.masked_fill(future, -std::numeric_limits<float>::infinity());
    auto y = torch::matmul(torch::softmax(scores, -1), v);  // [B, H, T, hd]
    return out->forward(y.transpose(1, 2).reshape({b, t, d}));
  }

 private:
  std::int64_t heads_, kv_heads_;

 public:
  Dense qkv, out;
};
TORCH_MODULE(CausalSelfAttention);

/// Dense SwiGLU feed-forward: down(silu(gate(x)) * up(x)).
class SwiGLUImpl : public torch::nn::Module {
 public:
  SwiGLUImpl(std::int64_t d, std::int64_t ff, const torch::TensorOptions& options, double out_std)
      : gate_proj(register_module("gate_proj", Dense(d, ff, options, init_std))),
        up_proj(register_module("up_proj", Dense(d, ff, options, init_std))),
        down_proj(register_module("down_proj", Dense(ff, d, options, out_std))) {}
  torch::Tensor forward(const torch::Tensor& x) {
    return down_proj->forward(torch::silu(gate_proj->forward(x)) * up_proj->forward(x));
  }
  Dense gate_proj, up_proj, down_proj;
};
TORCH_MODULE(SwiGLU);

/// One expert's matrices, when the experts are stored separately.
class ExpertImpl : public torch::nn::Module {
 public:
  ExpertImpl(std::int64_t d, std::int64_t ff, const torch::TensorOptions& options, double out_std)
      : gate_proj(register_parameter("gate_proj", normal_parameter({d, ff}, options, init_std))),
        up_proj(register_parameter("up_proj", normal_parameter({d, ff}, options, init_std))),
        down_proj(register_parameter("down_proj", normal_parameter({ff, d}, options, out_std))) {}
  torch::Tensor gate_proj, up_proj, down_proj;
};
TORCH_MODULE(Expert);

/// The experts of one MoE layer: stacked banks [E, rows, cols], or (separate)
/// one Expert module each, named by its index.
class ExpertBankImpl : public torch::nn::Module {
 public:
  ExpertBankImpl(std::int64_t experts, std::int64_t d, std::int64_t ff, const torch::TensorOptions& options,
                 double out_std, bool separate = false) {
    if (separate) {
      for (std::int64_t e = 0; e < experts; ++e)
        separate_.push_back(register_module(std::to_string(e), Expert(d, ff, options, out_std)));
      return;
    }
    gate_proj = register_parameter("gate_proj", normal_parameter({experts, d, ff}, options, init_std));
    up_proj = register_parameter("up_proj", normal_parameter({experts, d, ff}, options, init_std));
    down_proj = register_parameter("down_proj", normal_parameter({experts, ff, d}, options, out_std));
  }
  /// The experts' matrices. A bank's are views, taken once per forward:
  /// autograd then stacks their gradients once per bank (indexing the bank
  /// per expert would add a bank-sized gradient for every expert).
  struct Views {
    std::vector<torch::Tensor> gate, up, down;
  };
  Views views() {
    if (separate_.empty()) return {gate_proj.unbind(0), up_proj.unbind(0), down_proj.unbind(0)};
    Views w;
    for (const Expert& e : separate_) {
      w.gate.push_back(e->gate_proj);
      w.up.push_back(e->up_proj);
      w.down.push_back(e->down_proj);
    }
    return w;
  }
  /// SwiGLU of expert e on the rows of x ([n, d]).
  static torch::Tensor forward(const Views& w, std::size_t e, const torch::Tensor& x) {
    const auto xe = x.to(w.gate[e].scalar_type());
    return torch::matmul(torch::silu(torch::matmul(xe, w.gate[e])) * torch::matmul(xe, w.up[e]), w.down[e]);
  }
  torch::Tensor gate_proj, up_proj, down_proj;  // undefined when separate

 private:
  std::vector<Expert> separate_;
};
TORCH_MODULE(ExpertBank);

struct MoEOutput {
  torch::Tensor y;             ///< [N, d]
  torch::Tensor balance_loss;  ///< scalar; 1 when perfectly balanced
  std::vector<std::int64_t> counts;  ///< tokens routed to each expert (top-k assignments)
};

/// Mixture of SwiGLU experts with a top-k softmax router (fp32). Each token
/// goes to its k most probable experts; their outputs are mixed with the
/// renormalised router probabilities. Load-balancing loss (Switch
/// Transformer): E * sum_e f_e * P_e, f_e = share of assignments to e,
/// P_e = mean probability.
class MoEImpl : public torch::nn::Module {
 public:
  MoEImpl(const ModelConfig& c, const torch::TensorOptions& options, double out_std)
      : experts_(c.experts),
        top_k_(c.top_k),
        router(register_module("router", Dense(c.d_model, c.experts, options.dtype(torch::kFloat), init_std))),
        experts(register_module("experts", ExpertBank(c.experts, c.d_model, c.expert_ff, options, out_std,
                                                                  c.separate_experts))) {}

  MoEOutput forward(const torch::Tensor& x) {  // x: [N, d]
    const auto n = x.size(0);
    const auto probs = torch::softmax(router->forward(x).to(torch::kFloat), -1);  // [N, E]
    auto [top_p, top_i] = probs.topk(top_k_, -1);                                // [N, k]
    const auto weights = (top_p / top_p.sum(-1, true)).to(x.scalar_type());
    const auto flat_expert = top_i.reshape({-1});
    const auto flat_token = torch::arange(n, x.options().dtype(torch::kLong)).repeat_interleave(top_k_);
    const auto flat_weight = weights.reshape({-1});
    const auto order = flat_expert.argsort();
    const auto counts_t = torch::bincount(flat_expert, {}, experts_);

    MoEOutput out;
    const auto counts_host = counts_t.to(torch::kCPU);
    out.counts.assign(counts_host.data_ptr<std::int64_t>(), counts_host.data_ptr<std::int64_t>() + experts_);
    std::vector<torch::Tensor> tokens, outputs;
    std::int64_t start = 0;
    const ExpertBankImpl::Views w = experts->views();
    for (std::int64_t e = 0; e < experts_; ++e) {
      const std::int64_t count = out.counts[static_cast<std::size_t>(e)];
      if (count == 0) continue;
      const auto slots = order.narrow(0, start, count);
      start += count;
      const auto token = flat_token.index_select(0, slots);
      const auto ye = ExpertBankImpl::forward(w, static_cast<std::size_t>(e), x.index_select(0, token))
                          .to(x.scalar_type()) *
                      flat_weight.index_select(0, slots).unsqueeze(1);
      tokens.push_back(token);
      outputs.push_back(ye);
    }
    out.y = torch::zeros_like(x).index_add(0, torch::cat(tokens), torch::cat(outputs));
    const auto share = counts_t.to(torch::kFloat) / static_cast<double>(n * top_k_);
    out.balance_loss = static_cast<double>(experts_) * (share * probs.mean(0)).sum();
    return out;
  }

 private:
  std::int64_t experts_, top_k_;

 public:
  Dense router;
  ExpertBank experts;
};
TORCH_MODULE(MoE);

class BlockImpl : public torch::nn::Module {
 public:
  BlockImpl(const ModelConfig& c, const torch::TensorOptions& options, bool moe_block) {
    const double out_std = init_std / std::sqrt(2.0 * static_cast<double>(c.layers));
    ln1 = register_module("ln1", Norm(c.d_model, c.device));
    attn = register_module("attn", CausalSelfAttention(c, options, out_std));
    ln2 = register_module("ln2", Norm(c.d_model, c.device));
    if (moe_block) moe = register_module("moe", MoE(c, options, out_std));
    else ffn = register_module("ffn", SwiGLU(c.d_model, c.dense_ff, options, out_std));
  }

  /// Returns the block's output; an MoE block adds its balance loss to
  /// `balance` and its tokens per expert to `counts`.
  torch::Tensor forward(const torch::Tensor& x, torch::Tensor& balance,
                        std::vector<std::vector<std::int64_t>>& counts) {
    auto h = x + attn->forward(ln1->forward(x)).to(x.scalar_type());
    const auto z = ln2->forward(h);
    if (!moe) return h + ffn->forward(z).to(x.scalar_type());
    const auto shape = z.sizes().vec();
    MoEOutput m = moe->forward(z.reshape({-1, shape.back()}));
    balance = balance.defined() ? balance + m.balance_loss : m.balance_loss;
    counts.push_back(std::move(m.counts));
    return h + m.y.view(shape);
  }

  Norm ln1{nullptr}, ln2{nullptr};
  CausalSelfAttention attn{nullptr};
  SwiGLU ffn{nullptr};
  MoE moe{nullptr};
};
TORCH_MODULE(Block);

struct LMOutput {
  torch::Tensor logits;        ///< [B, T, V]
  torch::Tensor balance_loss;  ///< mean over MoE layers (scalar)
  std::vector<std::vector<std::int64_t>> expert_counts;  ///< per MoE layer: top-k assignments per expert
};

/// Next-token cross-entropy of logits [B, T, V] against targets [B, T], in fp32.
inline torch::Tensor lm_loss(const torch::Tensor& logits, const torch::Tensor& targets) {
  return torch::nn::functional::cross_entropy(logits.reshape({-1, logits.size(-1)}).to(torch::kFloat),
                                              targets.reshape({-1}).to(logits.device()));
}

/// What a training step needs: the mean next-token cross-entropy (fp32),
/// the balance loss and the tokens per expert.
struct LMLoss {
  torch::Tensor loss;          ///< scalar, fp32
  torch::Tensor balance_loss;  ///< mean over MoE layers (scalar)
  std::vector<std::vector<std::int64_t>> expert_counts;
};

/// A block as a reentrant checkpoint segment: forward keeps the block's
/// input alone; backward runs the block again from it and backpropagates
/// through that run, which completes (and, stepping inside backward, steps)
/// each of the block's parameters as the plain backward would. Outputs: the
/// block's output and its balance loss (0 for a dense block).
struct CheckpointedBlock : torch::autograd::Function<CheckpointedBlock> {
  static torch::autograd::variable_list forward(torch::autograd::AutogradContext* ctx, const torch::Tensor& x,
                                                BlockImpl* block, std::vector<std::vector<std::int64_t>>* counts) {
    ctx->saved_data["block"] = reinterpret_cast<std::int64_t>(block);
    ctx->saved_data["dense"] = !block->moe;
    ctx->save_for_backward({x});
    torch::Tensor balance;
    torch::Tensor h = block->forward(x, balance, *counts);
    if (!balance.defined()) balance = torch::zeros({}, x.options().dtype(torch::kFloat));
    return {h, balance};
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    auto* block = reinterpret_cast<BlockImpl*>(ctx->saved_data["block"].toInt());
    const torch::Tensor x = ctx->get_saved_variables()[0].detach().requires_grad_(true);
    torch::Tensor balance;
    std::vector<std::vector<std::int64_t>> counts;
    torch::Tensor h;
    {
      torch::AutoGradMode on(true);
      h = block->forward(x, balance, counts);
    }
    std::vector<torch::Tensor> outputs{h}, seeds{grads[0]};
    if (!ctx->saved_data["dense"].toBool() && grads[1].defined()) {
      outputs.push_back(balance);
      seeds.push_back(grads[1]);
    }
    torch::autograd::backward(outputs, seeds);
    return {x.grad(), torch::Tensor(), torch::Tensor()};
  }
};

/// The summed next-token cross-entropy (fp32) of one chunk of the LM head,
/// recomputed in backward. The head's weight (tied to the token embedding)
/// is an input, not reached by a backward of its own: its gradient goes back
/// through the outer pass, where the embedding's is added, so that it is
/// complete once.
struct CheckpointedHeadLoss : torch::autograd::Function<CheckpointedHeadLoss> {
  static torch::Tensor summed(const torch::Tensor& h, const torch::Tensor& weight, const torch::Tensor& targets) {
    const torch::Tensor logits = torch::nn::functional::linear(h, weight).to(torch::kFloat);
    return torch::nn::functional::cross_entropy(
        logits, targets, torch::nn::functional::CrossEntropyFuncOptions().reduction(torch::kSum));
  }
  static torch::Tensor forward(torch::autograd::AutogradContext* ctx, const torch::Tensor& h,
                               const torch::Tensor& weight, const torch::Tensor& targets) {
    ctx->save_for_backward({h, weight, targets});
    return summed(h, weight, targets);
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const torch::Tensor h = saved[0].detach().requires_grad_(true);
    const torch::Tensor weight = saved[1].detach().requires_grad_(true);
    torch::Tensor loss;
    {
      torch::AutoGradMode on(true);
      loss = summed(h, weight, saved[2]);
    }
    const auto g = torch::autograd::grad({loss}, {h, weight}, {grads[0]});
    return {g[0], g[1], torch::Tensor()};
  }
};

class MoELMImpl : public torch::nn::Module {
 public:
  explicit MoELMImpl(const ModelConfig& c) : config(c) {
    c.validate();
    const auto options = torch::TensorOptions().dtype(c.dtype).device(c.device);
    tok_emb = register_module("tok_emb", EmbeddingTable(c.vocab, c.d_model, options));
    pos_emb = register_module("pos_emb", EmbeddingTable(c.context, c.d_model, options));
    blocks = register_module("blocks", torch::nn::ModuleList());
    for (std::int64_t i = 0; i < c.layers; ++i) blocks->push_back(Block(c, options, i % 2 == 1));
    ln_f = register_module("ln_f", Norm(c.d_model, c.device));
  }

  /// idx: [B, T] int64 token ids on the model's device (or the CPU: moved).
  LMOutput forward(const torch::Tensor& idx) {
    const auto t = idx.size(1);
    if (t > config.context) throw std::invalid_argument("sequence longer than the model's context");
    const auto tokens = idx.to(tok_emb->weight.device());
    auto h = tok_emb->forward(tokens) + pos_emb->forward(torch::arange(t, tokens.options()));
    torch::Tensor balance;
    std::int64_t moe_layers = 0;
    LMOutput out;
    for (const auto& m : *blocks) {
      auto& block = *m->as<BlockImpl>();
      moe_layers += block.moe ? 1 : 0;
      h = block.forward(h, balance, out.expert_counts);
    }
    h = ln_f->forward(h);
    out.logits = torch::nn::functional::linear(h, tok_emb->weight);  // tied LM head
    out.balance_loss = moe_layers > 0 ? balance / static_cast<double>(moe_layers)
                                      : torch::zeros({}, h.options().dtype(torch::kFloat));
    return out;
  }

  /// The mean next-token cross-entropy of idx against targets [B, T], with
  /// the balance loss: forward() and lm_loss(), or, with
  /// ModelConfig::checkpoint, each block a checkpoint segment (when autograd
  /// records) and the head's loss formed in chunks of head_chunk tokens.
  LMLoss loss(const torch::Tensor& idx, const torch::Tensor& targets) {
    LMLoss r;
    if (!config.checkpoint) {
      LMOutput out = forward(idx);
      r.loss = lm_loss(out.logits, targets);
      r.balance_loss = out.balance_loss;
      r.expert_counts = std::move(out.expert_counts);
      return r;
    }
    const auto t = idx.size(1);
    if (t > config.context) throw std::invalid_argument("sequence longer than the model's context");
    const auto tokens = idx.to(tok_emb->weight.device());
    auto h = tok_emb->forward(tokens) + pos_emb->forward(torch::arange(t, tokens.options()));
    const bool recorded = torch::GradMode::is_enabled();
    torch::Tensor balance;
    std::int64_t moe_layers = 0;
    for (const auto& m : *blocks) {
      auto& block = *m->as<BlockImpl>();
      if (!block.moe) {
        std::vector<std::vector<std::int64_t>> none;
        h = recorded ? CheckpointedBlock::apply(h, &block, &none)[0] : block.forward(h, balance, none);
        continue;
      }
      ++moe_layers;
      torch::Tensor b;
      if (recorded) {
        auto outs = CheckpointedBlock::apply(h, &block, &r.expert_counts);
        h = outs[0];
        b = outs[1];
      } else {
        h = block.forward(h, b, r.expert_counts);
      }
      balance = balance.defined() ? balance + b : b;
    }
    h = ln_f->forward(h).reshape({-1, h.size(-1)});
    const auto flat = targets.reshape({-1}).to(h.device());
    const std::int64_t n = h.size(0);
    torch::Tensor sum;
    for (std::int64_t at = 0; at < n; at += config.head_chunk) {
      const std::int64_t len = std::min(config.head_chunk, n - at);
      const auto hc = h.narrow(0, at, len), tc = flat.narrow(0, at, len);
      const auto part = recorded ? CheckpointedHeadLoss::apply(hc, tok_emb->weight, tc)
                                 : CheckpointedHeadLoss::summed(hc, tok_emb->weight, tc);
      sum = sum.defined() ? sum + part : part;
    }
    r.loss = sum / static_cast<double>(n);
    r.balance_loss = moe_layers > 0 ? balance / static_cast<double>(moe_layers)
                                    : torch::zeros({}, h.options().dtype(torch::kFloat));
    return r;
  }

  ModelConfig config;
  EmbeddingTable tok_emb{nullptr}, pos_emb{nullptr};
  torch::nn::ModuleList blocks{nullptr};
  Norm ln_f{nullptr};
};
TORCH_MODULE(MoELM);

}  // namespace moe_lm
