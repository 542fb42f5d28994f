// One part of skewadam::compiled (skewadam/engine/backend/cpu/compiled.hpp): the kernel tables
// of one CPU level for parameters of one element type, every rule of a list.
// The build compiles this file once per level and type, naming them in
// SKEWADAM_COMPILED_PART_LEVEL (AVX512, AVX2, SSE, NEON, SCALAR) and
// SKEWADAM_COMPILED_PART_TYPE (F32, BF16, F16); the list is
// SKEWADAM_SHIPPED_RULES unless SKEWADAM_COMPILED_PART_RULES names another
// one (a macro of the same form, from SKEWADAM_COMPILED_PART_HEADER: the
// tools' own rules).

#define SKEWADAM_COMPILED_BUILDING
#include <skewadam/engine/backend/cpu/compiled.hpp>
#include <skewadam/tiers/variants.hpp>

#include <type_traits>

namespace skewadam::compiled_check {

template <class... Rules>
struct RuleList {
  template <class R>
  static constexpr bool has = (std::is_same_v<R, Rules>|| ...);
};
#define SKEWADAM_LIST_RULE_(RULE, ...) RULE,
using Shipped = RuleList<SKEWADAM_SHIPPED_RULES(SKEWADAM_LIST_RULE_, ~) void>;
#undef SKEWADAM_LIST_RULE_

/// Every rule a variant (variants.hpp) gives a tensor is in the library.
template <class Tiers>
constexpr bool listed() {
  return Shipped::has<typename Tiers::backbone> && Shipped::has<typename Tiers::backbone::rank1_rule> &&
         Shipped::has<typename Tiers::experts> && Shipped::has<typename Tiers::experts::rank1_rule> &&
         Shipped::has<typename Tiers::router> && Shipped::has<typename Tiers::router::rank1_rule>;
}
template <class... Tiers>
constexpr bool all_listed(VariantList<Tiers...>) {
  return (listed<Tiers>() && ...);
}
static_assert(all_listed(Variants{}),
              "SKEWADAM_SHIPPED_RULES (skewadam/engine/backend/cpu/compiled.hpp) misses a rule of a variant (skewadam/tiers/variants.hpp)");

}  // namespace skewadam::compiled_check

#if defined(SKEWADAM_COMPILED_PART_HEADER)
#include SKEWADAM_COMPILED_PART_HEADER
#endif
#if !defined(SKEWADAM_COMPILED_PART_RULES)
#define SKEWADAM_COMPILED_PART_RULES SKEWADAM_SHIPPED_RULES
#endif

#define SKEWADAM_CAT_(a, b) a##b
#define SKEWADAM_CAT(a, b) SKEWADAM_CAT_(a, b)
SKEWADAM_CAT(SKEWADAM_COMPILED_, SKEWADAM_COMPILED_PART_LEVEL)
(SKEWADAM_KERNEL_TABLES_LEVEL, SKEWADAM_COMPILED_PART_RULES, SKEWADAM_COMPILED_PART_TYPE, )
