#pragma once
// The LibTorch adapter's torch::serialize archive (Optimizer::save() and
// load(), torch::save and torch::load): the library's checkpoint bytes
// (checkpoint.hpp, docs/checkpoint-format.md) as one byte tensor, so a state
// saved through torch loads with skewadam::load_checkpoint and back.

#include <ATen/ATen.h>
#include <torch/serialize/archive.h>

#include <cstddef>
#include <cstdint>
#include <span>
#include <stdexcept>
#include <string>
#include <vector>

namespace skewadam::libtorch {

/// Version of the layout save() writes: 2, the library's checkpoint bytes
/// under "checkpoint" (1, a layout of its own, is no longer read).
inline constexpr std::int64_t archive_format_version = 2;

namespace detail {

/// Writes `bytes` (a checkpoint) into `archive`, which keeps its own copy.
inline void write_archive(::torch::serialize::OutputArchive& archive, const std::vector<std::byte>& bytes) {
  const auto n = static_cast<std::int64_t>(bytes.size());
  archive.write("skewadam_format", c10::IValue(archive_format_version));
  archive.write("checkpoint",
                at::from_blob(const_cast<std::byte*>(bytes.data()), {n}, at::TensorOptions().dtype(at::kByte)).clone(),
                true);
}

/// The checkpoint bytes of an archive write_archive() wrote, as a
/// contiguous CPU byte tensor (bytes_of() views it); std::invalid_argument
/// for another version or a missing tensor.
inline at::Tensor read_archive(::torch::serialize::InputArchive& archive) {
  c10::IValue v;
  if (!archive.try_read("skewadam_format", v) || !v.isInt())
    throw std::invalid_argument("archive: integer 'skewadam_format' is missing");
  if (v.toInt() != archive_format_version)
    throw std::invalid_argument("archive: format version " + std::to_string(v.toInt()) + ", this build reads " +
                                std::to_string(archive_format_version));
  at::Tensor t;
  if (!archive.try_read("checkpoint", t, true) || t.scalar_type() != at::kByte || t.dim() != 1)
    throw std::invalid_argument("archive: 'checkpoint' (a byte tensor) is missing");
  return t.to(at::kCPU).contiguous();
}

/// The bytes of a tensor read_archive() returned.
inline std::span<const std::byte> bytes_of(const at::Tensor& t) {
  return {reinterpret_cast<const std::byte*>(t.data_ptr<std::uint8_t>()), static_cast<std::size_t>(t.numel())};
}

}  // namespace detail
}  // namespace skewadam::libtorch
