#pragma once
// The kernels the tools and tests run besides the shipped rules', compiled
// once into the library skewadam_tool_kernels (tools/CMakeLists.txt) and
// declared extern here, as skewadam/engine/backend/cpu/compiled.hpp does for the shipped ones:
//
// - the CPU kernel tables of the golden cases' rules with round-to-nearest
//   parameters (SKEWADAM_TOOL_RULES; with_case_rule in golden_case.hpp), for
//   every dtype and compiled CPU level;
// - the CUDA backend's passes on the emulated runtime (emulated_runtime.hpp)
//   for the shipped rules and those.
//
// A translation unit that uses another rule instantiates it itself.

#include <skewadam/engine/backend/cpu/compiled.hpp>
#include <skewadam/rules.hpp>

/// The golden cases' rules with nearest rounding (closed under rank1_rule).
#define SKEWADAM_TOOL_RULES(X, ...)                                                 \
  X(::skewadam::BackboneRule::with_rounding<::skewadam::NearestRounding>, __VA_ARGS__)      \
  X(::skewadam::ExactMomentumRule::with_rounding<::skewadam::NearestRounding>, __VA_ARGS__) \
  X(::skewadam::ExpertRule::with_rounding<::skewadam::NearestRounding>, __VA_ARGS__)        \
  X(::skewadam::RouterRule::with_rounding<::skewadam::NearestRounding>, __VA_ARGS__)        \
  X(::skewadam::AdamWRule::with_rounding<::skewadam::NearestRounding>, __VA_ARGS__)

#if !defined(SKEWADAM_COMPILED_BUILDING)
SKEWADAM_KERNEL_TABLES(SKEWADAM_TOOL_RULES, F32, extern)
SKEWADAM_KERNEL_TABLES(SKEWADAM_TOOL_RULES, BF16, extern)
SKEWADAM_KERNEL_TABLES(SKEWADAM_TOOL_RULES, F16, extern)
#endif

/// One rule's emulated passes for parameters of one type (F32, BF16, F16):
/// `EXTERN template ...` (EXTERN: extern, or empty for the definition).
#define SKEWADAM_EMULATED_PASSES_ONE_(RULE, P, G, EXTERN)                                             \
  EXTERN template const ::skewadam::backend::cuda::GroupPasses<::emu::Runtime>*                       \
  ::skewadam::backend::cuda::passes_of<::emu::Runtime, RULE, P, G>();
#define SKEWADAM_EMULATED_PASSES_F32(RULE, EXTERN) SKEWADAM_EMULATED_PASSES_ONE_(RULE, float, float, EXTERN)
#define SKEWADAM_EMULATED_PASSES_BF16(RULE, EXTERN)                                      \
  SKEWADAM_EMULATED_PASSES_ONE_(RULE, ::skewadam::bf16, ::skewadam::bf16, EXTERN)       \
  SKEWADAM_EMULATED_PASSES_ONE_(RULE, ::skewadam::bf16, float, EXTERN)
#define SKEWADAM_EMULATED_PASSES_F16(RULE, EXTERN)                                     \
  SKEWADAM_EMULATED_PASSES_ONE_(RULE, ::skewadam::f16, ::skewadam::f16, EXTERN)       \
  SKEWADAM_EMULATED_PASSES_ONE_(RULE, ::skewadam::f16, float, EXTERN)
#define SKEWADAM_EMULATED_PASSES_RULE_(RULE, TYPE, EXTERN) \
  SKEWADAM_KERNEL_TABLES_CAT_(SKEWADAM_EMULATED_PASSES_, TYPE)(RULE, EXTERN)
/// Every rule of a list (RULES), for parameters of one type.
#define SKEWADAM_EMULATED_PASSES(RULES, TYPE, EXTERN) RULES(SKEWADAM_EMULATED_PASSES_RULE_, TYPE, EXTERN)
