// Inventory readers: the JSON inventory, safetensors headers (from bytes and
// from files written here), checkpoint folders and indexes, and every class
// of bad input, each with its message.

#include <doctest/doctest.h>

#include <skewadam/types/dtype.hpp>
#include <skewadam/plan.hpp>
#include <skewadam/types/shape.hpp>

#include <cstdint>
#include <string>
#include <vector>

#include <skewadam_tools/inventory.hpp>
#include <skewadam_tools/inventory_loader.hpp>
#include <skewadam_tools/safetensors.hpp>
#include "plan_test_support.hpp"

namespace test_plan_inventory {

using skewadam::Dtype;
using skewadam::index_t;
using skewadam::Shape;
using skewadam::tools::Inventory;
using skewadam::tools::InventoryError;
using skewadam::tools::parse_json_inventory;
using skewadam::tools::parse_safetensors;
using skewadam_plan_test::safetensors_bytes;
using skewadam_plan_test::TempDir;

namespace {

Inventory json(const std::string& text) { return parse_json_inventory(text, "inv.json"); }

std::string one_tensor(const std::string& fields) { return R"({"tensors": [{)" + fields + "}]}"; }

Inventory st(const std::string& header, std::uint64_t data_size) {
  const std::string bytes = safetensors_bytes(header, data_size);
  return parse_safetensors(bytes, bytes.size(), "m.safetensors");
}

std::string entry(const std::string& name, const std::string& dtype, const std::string& shape, std::uint64_t begin,
                  std::uint64_t end) {
  return "\"" + name + "\":{\"dtype\":\"" + dtype + "\",\"shape\":" + shape + ",\"data_offsets\":[" +
         std::to_string(begin) + "," + std::to_string(end) + "]}";
}

}  // namespace

// ------------------------------------------------------------------ JSON inventory

TEST_CASE("JSON inventory: names, shapes, dtypes in order; scalars as [1]; other keys ignored") {
  const Inventory inv = json(R"({
    "model": "toy", "tensors": [
      {"name": "a", "shape": [2, 3], "dtype": "f32", "note": {"deep": [1, [2]]}},
      {"name": "moe.experts.w", "shape": [4, 2, 3], "dtype": "bf16"},
      {"dtype": "float16", "shape": [], "name": "scale"},
      {"name": "r", "shape": [1, 1, 1, 1, 1, 1, 1, 5], "dtype": "BF16"}
    ]})");
  REQUIRE(inv.tensors.size() == 4);
  CHECK(inv.skipped.empty());
  CHECK(inv.tensors[0].name == "a");
  CHECK(inv.tensors[0].shape == Shape{2, 3});
  CHECK(inv.tensors[0].dtype == Dtype::f32);
  CHECK(inv.tensors[1].shape == Shape{4, 2, 3});
  CHECK(inv.tensors[1].dtype == Dtype::bf16);
  CHECK(inv.tensors[2].name == "scale");
  CHECK(inv.tensors[2].shape == Shape{1});
  CHECK(inv.tensors[2].dtype == Dtype::f16);
  CHECK(inv.tensors[3].shape.rank() == 8);
  CHECK(skewadam::make_plan(inv.tensors).total_params == 6 + 24 + 1 + 5);
}

TEST_CASE("JSON inventory: UTF-8 names, escapes and a byte-order mark are fine") {
  const Inventory inv = json("\xEF\xBB\xBF" R"({"tensors": [{"name": "caf\u00e9.\u4e2d", "shape": [1], "dtype": "f32"},
                                              {"name": "emb\u00e9d.w\u00f6", "shape": [1], "dtype": "f32"}]})");
  REQUIRE(inv.tensors.size() == 2);
  CHECK(inv.tensors[0].name == "caf\xC3\xA9.\xE4\xB8\xAD");
}

TEST_CASE("JSON inventory: bad input, one problem at a time") {
  SKEWADAM_CHECK_ERROR(InventoryError, json(R"({"tensors": [{"name": "a", "shape": [2], "dtype": "f32"})"),
                       "inv.json: the file is not valid JSON: parse error at line 1");
  SKEWADAM_CHECK_ERROR(InventoryError, json(""), "not valid JSON");
  SKEWADAM_CHECK_ERROR(InventoryError, json(R"({"tensors": [{"name": "a", "shape": [1], "dtype": "f32"}]} trailing)"), "not valid JSON");
  SKEWADAM_CHECK_ERROR(InventoryError, json("[1, 2]"), "inv.json: the document is not a JSON object");
  SKEWADAM_CHECK_ERROR(InventoryError, json("42"), "the document is not a JSON object");
  SKEWADAM_CHECK_ERROR(InventoryError, json(R"({"layers": []})"), "no \"tensors\" array");
  SKEWADAM_CHECK_ERROR(InventoryError, json(R"({"tensors": []})"), "\"tensors\" is empty");
  SKEWADAM_CHECK_ERROR(InventoryError, json(R"({"tensors": {}})"), "\"tensors\" must be one JSON array");
  SKEWADAM_CHECK_ERROR(InventoryError, json(R"({"tensors": 3})"), "\"tensors\" must be a JSON array, not an integer");
  SKEWADAM_CHECK_ERROR(InventoryError, json(R"({"tensors": [[]]})"), "tensors[0]: expected an object");
  SKEWADAM_CHECK_ERROR(InventoryError, json(R"({"tensors": ["a"]})"), "tensors[0]: expected an object, not a string");
  // dtypes
  SKEWADAM_CHECK_ERROR(InventoryError, json(one_tensor(R"("name": "a", "shape": [2], "dtype": "int8")")),
                       "tensors[0] 'a': dtype: unknown dtype 'int8' (expected f32, bf16 or f16)");
  SKEWADAM_CHECK_ERROR(InventoryError, json(one_tensor(R"("name": "a", "shape": [2], "dtype": 4)")),
                       "\"dtype\" must be a string, not an integer");
  // dimensions
  SKEWADAM_CHECK_ERROR(InventoryError, json(one_tensor(R"("name": "a", "shape": [2, 0], "dtype": "f32")")),
                       "tensors[0] 'a': shape: dimension 1 is zero (zero-size tensors are not supported)");
  SKEWADAM_CHECK_ERROR(InventoryError, json(one_tensor(R"("name": "a", "shape": [-3], "dtype": "f32")")),
                       "tensors[0] 'a': shape: dimension 0 is negative (-3)");
  SKEWADAM_CHECK_ERROR(InventoryError, json(one_tensor(R"("name": "a", "shape": [2.5], "dtype": "f32")")),
                       "dimension 0 is a non-integer number, not an integer");
  SKEWADAM_CHECK_ERROR(InventoryError, json(one_tensor(R"("name": "a", "shape": [4096.0], "dtype": "f32")")),
                       "not an integer");
  SKEWADAM_CHECK_ERROR(InventoryError, json(one_tensor(R"("name": "a", "shape": ["4"], "dtype": "f32")")),
                       "dimension 0 is a string, not an integer");
  SKEWADAM_CHECK_ERROR(InventoryError, json(one_tensor(R"("name": "a", "shape": [[4]], "dtype": "f32")")),
                       "dimension 0 is not an integer");
  SKEWADAM_CHECK_ERROR(InventoryError, json(one_tensor(R"("name": "a", "shape": [99999999999999999999], "dtype": "f32")")),
                       "not an integer");
  SKEWADAM_CHECK_ERROR(InventoryError, json(one_tensor(R"("name": "a", "shape": [1,1,1,1,1,1,1,1,1], "dtype": "f32")")),
                       "shape: more than 8 dimensions");
  SKEWADAM_CHECK_ERROR(InventoryError,
                       json(one_tensor(R"("name": "a", "shape": [4611686018427387904, 2], "dtype": "f32")")),
                       "tensors[0] 'a': shape: element count overflows 2^62");
  SKEWADAM_CHECK_ERROR(InventoryError, json(one_tensor(R"("name": "a", "shape": 4, "dtype": "f32")")),
                       "\"shape\" must be an array of integers");
  // missing or bad fields and names
  SKEWADAM_CHECK_ERROR(InventoryError, json(one_tensor(R"("shape": [2], "dtype": "f32")")),
                       "tensors[0]: missing \"name\"");
  SKEWADAM_CHECK_ERROR(InventoryError, json(one_tensor(R"("name": "a", "dtype": "f32")")), "tensors[0] 'a': missing \"shape\"");
  SKEWADAM_CHECK_ERROR(InventoryError, json(one_tensor(R"("name": "a", "shape": [2])")), "tensors[0] 'a': missing \"dtype\"");
  SKEWADAM_CHECK_ERROR(InventoryError, json(one_tensor(R"("name": "", "shape": [2], "dtype": "f32")")), "empty tensor name");
  SKEWADAM_CHECK_ERROR(InventoryError,
                       json(one_tensor("\"name\": \"" + std::string(5000, 'n') + "\", \"shape\": [2], \"dtype\": \"f32\"")),
                       "tensor name of 5000 bytes is longer than the limit of 4096");
  SKEWADAM_CHECK_ERROR(InventoryError,
                       json(R"({"tensors": [{"name": "a", "shape": [2], "dtype": "f32"},
                                            {"name": "b", "shape": [2], "dtype": "f32"},
                                            {"name": "a", "shape": [3], "dtype": "bf16"}]})"),
                       "inv.json: tensor 'a' appears more than once");
  SKEWADAM_CHECK_ERROR(InventoryError, json(R"({"tensors": [{"name": "a", "shape": [2], "dtype": "f32"}, {"name": "b"}]})"),
                       "tensors[1] 'b': missing \"shape\"");
  // encoding
  SKEWADAM_CHECK_ERROR(InventoryError, json(one_tensor("\"name\": \"a\xFF\", \"shape\": [2], \"dtype\": \"f32\"")),
                       "inv.json: the file is not valid UTF-8 (byte 24)");
  SKEWADAM_CHECK_ERROR(InventoryError, json(one_tensor("\"name\": \"\xC0\xAF\", \"shape\": [2], \"dtype\": \"f32\"")),
                       "not valid UTF-8");  // overlong '/'
  SKEWADAM_CHECK_ERROR(InventoryError, json(one_tensor("\"name\": \"\xED\xA0\x80\", \"shape\": [2], \"dtype\": \"f32\"")),
                       "not valid UTF-8");  // an encoded surrogate
  SKEWADAM_CHECK_ERROR(InventoryError, json(one_tensor(R"("name": "a\ud800", "shape": [2], "dtype": "f32")")),
                       "not valid JSON");  // a lone escaped surrogate
  // nesting, even in ignored fields
  SKEWADAM_CHECK_ERROR(InventoryError, json(R"({"x": )" + std::string(100, '[') + std::string(100, ']') + "}"),
                       "JSON nested more than 64 levels deep");
}

TEST_CASE("UTF-8 validation") {
  using skewadam::tools::detail::first_invalid_utf8;
  constexpr auto ok = std::string_view::npos;
  CHECK(first_invalid_utf8("plain.ascii") == ok);
  CHECK(first_invalid_utf8("\xC3\xA9\xE4\xB8\xAD\xF0\x9F\x98\x80\xF4\x8F\xBF\xBF") == ok);
  CHECK(first_invalid_utf8("a\x80") == 1);          // lone continuation byte
  CHECK(first_invalid_utf8("ab\xC3") == 2);         // truncated
  CHECK(first_invalid_utf8("\xC1\xBF") == 0);       // overlong
  CHECK(first_invalid_utf8("\xE0\x80\xAF") == 0);   // overlong
  CHECK(first_invalid_utf8("\xED\xBF\xBF") == 0);   // surrogate
  CHECK(first_invalid_utf8("\xF4\x90\x80\x80") == 0);  // above U+10FFFF
  CHECK(first_invalid_utf8("\xF5\x80\x80\x80") == 0);
  CHECK(first_invalid_utf8("\xE4\xB8x") == 0);      // bad continuation
}

// ------------------------------------------------------------------ safetensors

TEST_CASE("safetensors header: tensors in data order, metadata skipped, integer buffers left out") {
  const std::string header = "{\"__metadata__\":{\"format\":\"pt\",\"x\":\"y\"}," +
                             entry("model.layers.0.mlp.gate.weight", "F32", "[2,4]", 64, 96) + "," +
                             entry("model.embed_tokens.weight", "BF16", "[8,4]", 0, 64) + "," +
                             entry("position_ids", "I64", "[1,3]", 96, 120) + "," +
                             entry("model.layers.0.mlp.experts.0.w1.weight", "F16", "[2,6,4]", 120, 216) + "," +
                             entry("logit_scale", "F32", "[]", 216, 220) + "}  ";
  const Inventory inv = st(header, 220);
  REQUIRE(inv.tensors.size() == 4);
  CHECK(inv.tensors[0].name == "model.embed_tokens.weight");
  CHECK(inv.tensors[0].dtype == Dtype::bf16);
  CHECK(inv.tensors[0].shape == Shape{8, 4});
  CHECK(inv.tensors[1].name == "model.layers.0.mlp.gate.weight");
  CHECK(inv.tensors[1].dtype == Dtype::f32);
  CHECK(inv.tensors[2].dtype == Dtype::f16);
  CHECK(inv.tensors[2].shape == Shape{2, 6, 4});
  CHECK(inv.tensors[3].name == "logit_scale");
  CHECK(inv.tensors[3].shape == Shape{1});
  REQUIRE(inv.skipped.size() == 1);
  CHECK(inv.skipped[0].name == "position_ids");
  CHECK(inv.skipped[0].dtype == "I64");

  const skewadam::Plan p = skewadam::make_plan(inv.tensors);
  CHECK(p.tiers.router.params == 8);
  CHECK(p.tiers.experts.params == 48);
  CHECK(p.tiers.backbone.params == 33);
}

TEST_CASE("safetensors header: gaps are allowed; trailing bytes after the header are ignored") {
  const std::string bytes = safetensors_bytes("{" + entry("a", "F32", "[2]", 8, 16) + "}", 32);
  const Inventory inv = parse_safetensors(bytes + "extra", bytes.size(), "m");
  REQUIRE(inv.tensors.size() == 1);
}

TEST_CASE("safetensors header: a file of terabytes is planned from its header alone") {
  // [2^20, 2^20] F32 needs 2^42 bytes of data; only the header is in memory.
  const std::string header = "{" + entry("moe.experts.w", "F32", "[1048576,1048576]", 0, std::uint64_t{1} << 42) + "}";
  const std::string bytes = safetensors_bytes(header, 0);
  const Inventory inv = parse_safetensors(bytes, bytes.size() + (std::uint64_t{1} << 42), "huge.safetensors");
  REQUIRE(inv.tensors.size() == 1);
  CHECK(inv.tensors[0].numel() == index_t{1} << 40);
  // One byte less of data, and the same header is out of range.
  SKEWADAM_CHECK_ERROR(InventoryError,
                       parse_safetensors(bytes, bytes.size() + (std::uint64_t{1} << 42) - 1, "huge.safetensors"),
                       "out of range");
}

TEST_CASE("safetensors header length: checked against the file before anything is read or allocated") {
  const std::string ok = "{" + entry("a", "F32", "[2]", 0, 8) + "}";
  // Longer than the file.
  const std::string over = safetensors_bytes(ok, 8, 4096);
  SKEWADAM_CHECK_ERROR(InventoryError, parse_safetensors(over, over.size(), "m.safetensors"),
                       "m.safetensors: header length 4096 exceeds the file");
  // Absurd, whatever the file size claims.
  const std::string absurd = safetensors_bytes(ok, 8, ~std::uint64_t{0});
  SKEWADAM_CHECK_ERROR(InventoryError, parse_safetensors(absurd, std::uint64_t{1} << 62, "m.safetensors"),
                       "header length 18446744073709551615 is absurd (the limit is 100000000 bytes)");
  const std::string big = safetensors_bytes(ok, 8, 100'000'001);
  SKEWADAM_CHECK_ERROR(InventoryError, parse_safetensors(big, std::uint64_t{1} << 40, "m"), "is absurd");
  // Too short for a length, or for a header.
  SKEWADAM_CHECK_ERROR(InventoryError, parse_safetensors(std::string_view("\x05\x00", 2), 2, "m"), "m: 2 bytes is too short for a safetensors file");
  SKEWADAM_CHECK_ERROR(InventoryError, parse_safetensors("", 0, "m"), "0 bytes is too short");
  const std::string tiny = safetensors_bytes("{", 0);
  SKEWADAM_CHECK_ERROR(InventoryError, parse_safetensors(tiny, tiny.size(), "m"), "header length 1 is too short");
  // The buffer given holds less than the header the length announces.
  const std::string full = safetensors_bytes(ok, 8);
  SKEWADAM_CHECK_ERROR(InventoryError, parse_safetensors(std::string_view(full).substr(0, 20), full.size(), "m"),
                       "only 12 of the header's");
  CHECK(skewadam::tools::safetensors_header_length(full, full.size(), "m") == ok.size());
}

TEST_CASE("safetensors header: bad input, one problem at a time") {
  // data section of 64 bytes in each case
  auto bad = [](const std::string& header) { return st(header, 64); };
  SKEWADAM_CHECK_ERROR(InventoryError, bad("{" + entry("a", "F32", "[4]", 16, 80) + "}"),
                       "m.safetensors: tensor 'a': data_offsets [16, 80] are out of range (the data section holds 64 bytes)");
  SKEWADAM_CHECK_ERROR(InventoryError, bad("{" + entry("a", "F32", "[4]", 16, 0) + "}"), "data_offsets [16, 0] are out of range");
  SKEWADAM_CHECK_ERROR(InventoryError, bad("{" + entry("a", "F32", "[4]", 0, 12) + "}"),
                       "tensor 'a': data_offsets [0, 12] span 12 bytes, but shape [4] of F32 needs 16");
  SKEWADAM_CHECK_ERROR(InventoryError, bad("{" + entry("a", "F32", "[4]", 0, 16) + "," + entry("b", "BF16", "[4]", 8, 16) + "}"),
                       "tensors 'a' [0, 16] and 'b' [8, 16] overlap in the data section");
  SKEWADAM_CHECK_ERROR(InventoryError, bad("{" + entry("a", "F32", "[4]", 0, 16) + "," + entry("a", "F32", "[4]", 16, 32) + "}"),
                       "m.safetensors: tensor 'a' appears more than once");
  SKEWADAM_CHECK_ERROR(InventoryError, bad("{" + entry("a", "F32", "[1099511627776,1099511627776]", 0, 64) + "}"),
                       "shape [1099511627776, 1099511627776] of F32 needs more bytes than the data section holds (64)");
  SKEWADAM_CHECK_ERROR(InventoryError, bad("{" + entry("a", "F32", "[0,4]", 0, 0) + "}"),
                       "tensor 'a': shape: dimension 0 is zero (zero-size tensors are not supported)");
  SKEWADAM_CHECK_ERROR(InventoryError, bad("{" + entry("a", "F32", "[4,-1]", 0, 16) + "}"), "dimension 1 is negative (-1)");
  SKEWADAM_CHECK_ERROR(InventoryError, bad("{" + entry("a", "F32", "[1.5]", 0, 16) + "}"), "not an integer");
  SKEWADAM_CHECK_ERROR(InventoryError, bad("{" + entry("a", "Q8", "[4]", 0, 16) + "}"), "tensor 'a': unknown dtype 'Q8'");
  SKEWADAM_CHECK_ERROR(InventoryError, bad("{" + entry("a", "f32", "[4]", 0, 16) + "}"), "unknown dtype 'f32'");
  SKEWADAM_CHECK_ERROR(InventoryError, bad("{" + entry("a", "F64", "[4]", 0, 32) + "}"),
                       "tensor 'a': unsupported dtype F64 (skewadam trains F32, BF16 and F16 parameters)");
  SKEWADAM_CHECK_ERROR(InventoryError, bad("{" + entry("a", "F8_E4M3", "[4]", 0, 4) + "}"), "unsupported dtype F8_E4M3");
  SKEWADAM_CHECK_ERROR(InventoryError, bad("{" + entry("ids", "I64", "[4]", 0, 32) + "}"),
                       "no F32, BF16 or F16 tensors in the header (only integer or boolean buffers)");
  SKEWADAM_CHECK_ERROR(InventoryError, bad("{" + entry("ids", "I64", "[4]", 0, 16) + "}"), "span 16 bytes, but shape [4] of I64 needs 32");
  SKEWADAM_CHECK_ERROR(InventoryError, bad(R"({"__metadata__":{"a":"b"}})"), "no F32, BF16 or F16 tensors");
  SKEWADAM_CHECK_ERROR(InventoryError, bad("{}"), "no F32, BF16 or F16 tensors");
  // structure
  SKEWADAM_CHECK_ERROR(InventoryError, bad(R"([{"a":1}])"), "m.safetensors: the header is not a JSON object");
  SKEWADAM_CHECK_ERROR(InventoryError, bad(R"({"a":[1,2]})"), "tensor 'a': expected an object");
  SKEWADAM_CHECK_ERROR(InventoryError, bad(R"({"a":"F32"})"), "tensor 'a': expected an object {\"dtype\", \"shape\", \"data_offsets\"}, not a string");
  SKEWADAM_CHECK_ERROR(InventoryError, bad(R"({"a":{"shape":[4],"data_offsets":[0,16]}})"), "tensor 'a': missing \"dtype\"");
  SKEWADAM_CHECK_ERROR(InventoryError, bad(R"({"a":{"dtype":"F32","data_offsets":[0,16]}})"), "tensor 'a': missing \"shape\"");
  SKEWADAM_CHECK_ERROR(InventoryError, bad(R"({"a":{"dtype":"F32","shape":[4]}})"), "tensor 'a': missing \"data_offsets\"");
  SKEWADAM_CHECK_ERROR(InventoryError, bad(R"({"a":{"dtype":"F32","shape":[4],"data_offsets":[0]}})"),
                       "\"data_offsets\" must be [begin, end], got 1 values");
  SKEWADAM_CHECK_ERROR(InventoryError, bad(R"({"a":{"dtype":"F32","shape":[4],"data_offsets":[0,16,32]}})"),
                       "\"data_offsets\" has more than two values");
  SKEWADAM_CHECK_ERROR(InventoryError, bad(R"({"a":{"dtype":"F32","shape":[4],"data_offsets":[-1,16]}})"),
                       "\"data_offsets\" must hold non-negative integers");
  SKEWADAM_CHECK_ERROR(InventoryError, bad(R"({"a":{"dtype":"F32","shape":[4],"data_offsets":[0,1e2]}})"),
                       "\"data_offsets\" must hold non-negative integers");
  SKEWADAM_CHECK_ERROR(InventoryError, bad(R"({"a":{"dtype":"F32","shape":{},"data_offsets":[0,16]}})"),
                       "\"shape\" must be one array of integers");
  SKEWADAM_CHECK_ERROR(InventoryError, bad(R"({"a":{"dtype":"F32","shape":[4],"shape":[4],"data_offsets":[0,16]}})"),
                       "\"shape\" must be one array of integers");
  SKEWADAM_CHECK_ERROR(InventoryError, bad(R"({"a":{"dtype":["F32"],"shape":[4],"data_offsets":[0,16]}})"),
                       "\"dtype\" must be a string");
  SKEWADAM_CHECK_ERROR(InventoryError, bad(R"({"":{"dtype":"F32","shape":[4],"data_offsets":[0,16]}})"), "empty tensor name");
  // JSON and encoding
  SKEWADAM_CHECK_ERROR(InventoryError, bad(R"({"a":{"dtype":"F32",)"), "m.safetensors: the JSON header is not valid JSON");
  SKEWADAM_CHECK_ERROR(InventoryError, bad("{\"a\xC3\x28\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[0,16]}}"),
                       "m.safetensors: the JSON header is not valid UTF-8 (byte 3)");
  SKEWADAM_CHECK_ERROR(InventoryError, bad(R"({"__metadata__":)" + std::string(80, '[') + std::string(80, ']') + "}"),
                       "nested more than 64 levels deep");
}

TEST_CASE("safetensors: unknown fields and odd metadata are tolerated") {
  const Inventory inv = st(R"({"__metadata__": [1, {"x": null}], "a": {"dtype": "F16", "shape": [4], "data_offsets": [0, 8], "extra": {"y": [true]}}})", 8);
  REQUIRE(inv.tensors.size() == 1);
  CHECK(inv.tensors[0].dtype == Dtype::f16);
}

TEST_CASE("safetensors file: written here, read back from disk; a file whose header overruns it is an error") {
  TempDir dir;
  const std::string header = "{" + entry("blocks.1.moe.router.weight", "F32", "[4,8]", 0, 128) + "," +
                             entry("blocks.1.moe.experts.w1", "BF16", "[4,8,8]", 128, 640) + "," +
                             entry("tok_emb.weight", "BF16", "[16,8]", 640, 896) + "}";
  const auto good = dir.write("model.safetensors", safetensors_bytes(header, 896));
  const Inventory inv = skewadam::tools::read_safetensors(good);
  REQUIRE(inv.tensors.size() == 3);
  CHECK(inv.tensors[1].shape == Shape{4, 8, 8});
  const skewadam::Plan p = skewadam::make_plan(inv.tensors);
  CHECK(p.tiers.router.state_bytes == 4 * 32);
  CHECK(p.tiers.experts.state_bytes == 4 * 4 * (8 + 8));
  CHECK(p.tiers.backbone.state_bytes == 4 * 128 + 4 * (16 + 8));

  // The header length claims more bytes than the file has.
  std::string bytes = safetensors_bytes(header, 896, 5000);
  const auto overrun = dir.write("overrun.safetensors", bytes.substr(0, 8 + 100));
  SKEWADAM_CHECK_ERROR(InventoryError, skewadam::tools::read_safetensors(overrun),
                       "overrun.safetensors: header length 5000 exceeds the file (100 bytes follow the length)");
  const auto absurd = dir.write("absurd.safetensors", safetensors_bytes(header, 0, std::uint64_t{1} << 50));
  SKEWADAM_CHECK_ERROR(InventoryError, skewadam::tools::read_safetensors(absurd), "is absurd");
  const auto truncated = dir.write("truncated.safetensors", std::string(5, '\0'));
  SKEWADAM_CHECK_ERROR(InventoryError, skewadam::tools::read_safetensors(truncated), "5 bytes is too short");
  SKEWADAM_CHECK_ERROR(InventoryError, skewadam::tools::read_safetensors(dir.path() / "missing.safetensors"),
                       "missing.safetensors: cannot read");
}

// ------------------------------------------------------------------ loading inputs

TEST_CASE("load_inventory: files, folders, sharded indexes, sniffing, and names across files") {
  using skewadam::tools::load_inventory;
  TempDir dir;
  const std::string shard1 = safetensors_bytes("{" + entry("a.weight", "F32", "[3,5]", 0, 60) + "}", 60);
  const std::string shard2 = safetensors_bytes(
      "{" + entry("moe.experts.w1", "BF16", "[4,3,5]", 0, 120) + "," + entry("moe.router.weight", "F32", "[4,5]", 120, 200) + "}",
      200);
  dir.write("ckpt/model-00001-of-00002.safetensors", shard1);
  dir.write("ckpt/model-00002-of-00002.safetensors", shard2);
  const std::string index = R"({"metadata": {"total_size": 260}, "weight_map": {
      "a.weight": "model-00001-of-00002.safetensors",
      "moe.experts.w1": "model-00002-of-00002.safetensors",
      "moe.router.weight": "model-00002-of-00002.safetensors"}})";

  SUBCASE("a folder without an index: every .safetensors file, sorted") {
    const Inventory inv = load_inventory({(dir.path() / "ckpt").string()});
    REQUIRE(inv.tensors.size() == 3);
    CHECK(inv.tensors[0].name == "a.weight");
  }
  SUBCASE("a folder with an index, and the index itself") {
    dir.write("ckpt/model.safetensors.index.json", index);
    dir.write("ckpt/consolidated.safetensors", shard1);  // would clash, but the index decides
    CHECK(load_inventory({(dir.path() / "ckpt").string()}).tensors.size() == 3);
    CHECK(load_inventory({(dir.path() / "ckpt" / "model.safetensors.index.json").string()}).tensors.size() == 3);
  }
  SUBCASE("several files are one model; a name twice is an error") {
    const std::string a = (dir.path() / "ckpt/model-00001-of-00002.safetensors").string();
    const std::string b = (dir.path() / "ckpt/model-00002-of-00002.safetensors").string();
    CHECK(load_inventory({a, b}).tensors.size() == 3);
    SKEWADAM_CHECK_ERROR(InventoryError, load_inventory({a, b, a}), "tensor 'a.weight' was already read from");
  }
  SUBCASE("extensions decide; other files are sniffed") {
    const auto inv_json = dir.write("inventory.txt", "  \n{\"tensors\": [{\"name\": \"x\", \"shape\": [2], \"dtype\": \"f32\"}]}");
    CHECK(load_inventory({inv_json.string()}).tensors.size() == 1);
    const auto st_file = dir.write("weights.bin", shard1);
    CHECK(load_inventory({st_file.string()}).tensors.size() == 1);
    const auto j = dir.write("inv.json", R"({"tensors": [{"name": "x", "shape": [2], "dtype": "bf16"}]})");
    CHECK(load_inventory({j.string()}).tensors[0].dtype == Dtype::bf16);
  }
  SUBCASE("errors name the input") {
    SKEWADAM_CHECK_ERROR(InventoryError, load_inventory({(dir.path() / "nope.json").string()}), "nope.json: no such file or folder");
    dir.write("empty/readme.txt", "hi");
    SKEWADAM_CHECK_ERROR(InventoryError, load_inventory({(dir.path() / "empty").string()}), "folder holds no .safetensors files");
    const auto missing = dir.write("ckpt2/model.safetensors.index.json", R"({"weight_map": {"a": "gone.safetensors"}})");
    SKEWADAM_CHECK_ERROR(InventoryError, load_inventory({missing.string()}), "gone.safetensors: cannot read");
    const auto no_map = dir.write("x.index.json", R"({"metadata": {}})");
    SKEWADAM_CHECK_ERROR(InventoryError, load_inventory({no_map.string()}), "no \"weight_map\" naming shard files");
    const auto abs_shard = dir.write("y.index.json", R"({"weight_map": {"a": "/etc/passwd"}})");
    SKEWADAM_CHECK_ERROR(InventoryError, load_inventory({abs_shard.string()}), "must be a path relative to the index");
    const auto bad_map = dir.write("z.index.json", R"({"weight_map": {"a": 3}})");
    SKEWADAM_CHECK_ERROR(InventoryError, load_inventory({bad_map.string()}), "tensor 'a' must map to a file name");
    const auto bad_json = dir.write("bad.json", R"({"tensors": [)");
    SKEWADAM_CHECK_ERROR(InventoryError, load_inventory({bad_json.string()}), "bad.json: the file is not valid JSON");
  }
}

}  // namespace test_plan_inventory
