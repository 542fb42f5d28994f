#!/usr/bin/env python3
"""Writes the skewadam-plan test inputs in this folder and the fuzz seed corpus.

Run from anywhere: python3 tests/data/plan/make_files.py. The outputs are
committed; this script documents how each was made and regenerates them.
Data sections are zeros: only headers matter to the planner.
"""
import json
import pathlib
import struct

HERE = pathlib.Path(__file__).resolve().parent


def safetensors(header, data_size, length=None, raw_header=None):
    """bytes of a safetensors file: 8-byte length, header, data_size zero bytes."""
    h = raw_header if raw_header is not None else json.dumps(header, separators=(",", ":")).encode()
    n = len(h) if length is None else length
    return struct.pack("<Q", n) + h + bytes(data_size)


def write(name, data):
    path = HERE / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data if isinstance(data, bytes) else data.encode())


def tensor(dtype, shape, begin, end):
    return {"dtype": dtype, "shape": shape, "data_offsets": [begin, end]}


# ---- good inputs
small = {
    "__metadata__": {"format": "pt"},
    "model.embed_tokens.weight": tensor("BF16", [8, 4], 0, 64),
    "model.layers.0.mlp.gate.weight": tensor("F32", [2, 4], 64, 96),
    "model.layers.0.mlp.experts.0.w1.weight": tensor("BF16", [2, 6, 4], 96, 192),
    "model.norm.weight": tensor("F32", [4], 192, 208),
    "position_ids": tensor("I64", [1, 3], 208, 232),
}
write("small.safetensors", safetensors(small, 232))
write(
    "small.json",
    json.dumps(
        {
            "tensors": [
                {"name": "model.embed_tokens.weight", "shape": [8, 4], "dtype": "bf16"},
                {"name": "model.layers.0.mlp.gate.weight", "shape": [2, 4], "dtype": "f32"},
                {"name": "model.layers.0.mlp.experts.0.w1.weight", "shape": [2, 6, 4], "dtype": "bf16"},
                {"name": "model.norm.weight", "shape": [4], "dtype": "f32"},
            ]
        },
        indent=1,
    )
    + "\n",
)
# A sharded checkpoint: an index and two shards.
shard1 = {"a.weight": tensor("F32", [3, 5], 0, 60)}
shard2 = {"layers.0.moe.experts.w1": tensor("BF16", [4, 3, 5], 0, 120), "layers.0.moe.router.weight": tensor("F32", [4, 5], 120, 200)}
write("sharded/model-00001-of-00002.safetensors", safetensors(shard1, 60))
write("sharded/model-00002-of-00002.safetensors", safetensors(shard2, 200))
index = {"metadata": {"total_size": 380}, "weight_map": {"a.weight": "model-00001-of-00002.safetensors"}}
index["weight_map"].update({k: "model-00002-of-00002.safetensors" for k in shard2})
write("sharded/model.safetensors.index.json", json.dumps(index, indent=1) + "\n")

# ---- bad inputs, one problem each
write("bad/malformed.json", '{"tensors": [{"name": "a", "shape": [2, 3], "dtype": "f32"}\n')
write("bad/unknown_dtype.json", '{"tensors": [{"name": "a", "shape": [2, 3], "dtype": "int4"}]}\n')
write("bad/zero_dim.json", '{"tensors": [{"name": "a", "shape": [2, 0], "dtype": "f32"}]}\n')
write("bad/negative_dim.json", '{"tensors": [{"name": "a", "shape": [-2, 3], "dtype": "f32"}]}\n')
write("bad/no_tensors.json", '{"layers": []}\n')
write("bad/duplicate_name.json", '{"tensors": [{"name": "a", "shape": [2], "dtype": "f32"}, {"name": "a", "shape": [3], "dtype": "f32"}]}\n')
write("bad/non_utf8_name.json", b'{"tensors": [{"name": "a\xff\xfe", "shape": [2], "dtype": "f32"}]}\n')
ok = {"w": tensor("F32", [2, 2], 0, 16)}
write("bad/header_exceeds_file.safetensors", safetensors(ok, 16, length=4096))
write("bad/header_absurd.safetensors", safetensors(ok, 16, length=(1 << 64) - 1))
write("bad/too_short.safetensors", b"\x10\x00\x00")
write("bad/offsets_out_of_range.safetensors", safetensors({"w": tensor("F32", [2, 2], 8, 24)}, 16))
write("bad/offsets_size_mismatch.safetensors", safetensors({"w": tensor("F32", [2, 2], 0, 12)}, 16))
write("bad/offsets_overlap.safetensors",
      safetensors({"u": tensor("F32", [2, 2], 0, 16), "v": tensor("F32", [2], 8, 16)}, 16))
write("bad/zero_dim.safetensors", safetensors({"w": tensor("F32", [0, 2], 0, 0), "x": tensor("F32", [1], 0, 4)}, 4))
write("bad/unknown_dtype.safetensors", safetensors({"w": tensor("Q4", [2, 2], 0, 16)}, 16))
write("bad/unsupported_dtype.safetensors", safetensors({"w": tensor("F64", [2, 2], 0, 32)}, 32))
write("bad/non_utf8_name.safetensors",
      safetensors(None, 16, raw_header=b'{"w\xc3\x28":{"dtype":"F32","shape":[2,2],"data_offsets":[0,16]}}'))
write("bad/not_json.safetensors", safetensors(None, 16, raw_header=b"PK\x03\x04 this is a zip"))

# ---- fuzz seeds (small, varied, mostly valid)
write("corpus/one_f32.safetensors", safetensors({"w": tensor("F32", [2, 2], 0, 16)}, 16))
write("corpus/small.safetensors", safetensors(small, 232))
write("corpus/padded.safetensors", safetensors(None, 8, raw_header=b'{"b":{"dtype":"BF16","shape":[4],"data_offsets":[0,8]}}   '))
write("corpus/scalar_and_rank4.safetensors",
      safetensors({"s": tensor("F16", [], 0, 2), "k": tensor("F16", [2, 1, 3, 2], 2, 26)}, 26))
write("corpus/metadata_only.safetensors", safetensors({"__metadata__": {"a": "b"}}, 0))
write("corpus/bad_overlap.safetensors", (HERE / "bad/offsets_overlap.safetensors").read_bytes())
