// libFuzzer target for the safetensors header parser (scripts/fuzz-plan runs it).
//
// The input is a whole file. It is parsed twice: as a file of exactly that
// size, and as the start of a much larger file (a huge data section), which
// reaches the offset and size checks with large values. Both must either
// succeed or throw InventoryError; anything else (a crash, another exception,
// a large allocation) is a finding.

#include <cstddef>
#include <cstdint>
#include <string_view>

#include <skewadam/plan.hpp>

#include <skewadam_tools/inventory.hpp>
#include <skewadam_tools/safetensors.hpp>

namespace {

void parse_one(std::string_view bytes, std::uint64_t file_size) {
  try {
    const skewadam::tools::Inventory inv = skewadam::tools::parse_safetensors(bytes, file_size, "fuzz");
    // Whatever parses must also plan.
    (void)skewadam::make_plan(inv.tensors);
  } catch (const skewadam::tools::InventoryError&) {
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string_view bytes(reinterpret_cast<const char*>(data), size);
  parse_one(bytes, size);
  parse_one(bytes, std::uint64_t{size} + (std::uint64_t{1} << 40));
  return 0;
}
