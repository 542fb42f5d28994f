// One part of skewadam_tool_kernels (skewadam_tools/tool_kernels.hpp): the
// CUDA backend's passes on the emulated runtime for one list of rules
// (SKEWADAM_EMULATED_PART_RULES) and parameters of one type
// (SKEWADAM_EMULATED_PART_TYPE: F32, BF16, F16).

#define SKEWADAM_COMPILED_BUILDING
#include <skewadam_tools/emulated_runtime.hpp>
#include <skewadam_tools/tool_kernels.hpp>

SKEWADAM_EMULATED_PASSES(SKEWADAM_EMULATED_PART_RULES, SKEWADAM_EMULATED_PART_TYPE, )
