"""Counter-based random bits for stochastic rounding (docs/spec.md §4.3).

Philox4x32 (Salmon, Moraes, Dror and Shaw, "Parallel random numbers: as easy
as 1, 2, 3", SC'11) written out in NumPy, vectorised over many counters, and
the way the library maps (seed, step, tensor stream, element index) to it.
"""

import numpy as np

# The round's multipliers and the key schedule's increments (the paper's
# Table 2 and its "Weyl sequence" constants).
_M0 = np.uint64(0xD2511F53)
_M1 = np.uint64(0xCD9E8D57)
_W0 = 0x9E3779B9
_W1 = 0xBB67AE85
_MASK32 = np.uint64(0xFFFFFFFF)


def philox4x32(counter, key, rounds=10):
    """Philox4x32 with `rounds` rounds.

    counter: uint32 array of shape [..., 4]; key: two 32-bit integers, or a
    uint32 array of shape [..., 2] broadcasting against counter[..., :2].
    Returns the four output words, uint32 [..., 4].
    """
    c = np.asarray(counter, dtype=np.uint32).astype(np.uint64)
    k = np.asarray(key, dtype=np.uint64)
    c0, c1, c2, c3 = c[..., 0], c[..., 1], c[..., 2], c[..., 3]
    k0 = k[..., 0] & _MASK32
    k1 = k[..., 1] & _MASK32
    for r in range(rounds):
        if r > 0:  # the key advances before every round but the first
            k0 = (k0 + np.uint64(_W0)) & _MASK32
            k1 = (k1 + np.uint64(_W1)) & _MASK32
        p0 = _M0 * c0  # 32 x 32 -> 64-bit products: exact in uint64
        p1 = _M1 * c2
        hi0, lo0 = p0 >> np.uint64(32), p0 & _MASK32
        hi1, lo1 = p1 >> np.uint64(32), p1 & _MASK32
        c0, c1, c2, c3 = hi1 ^ c1 ^ k0, lo1, hi0 ^ c3 ^ k1, lo0
    return np.stack([c0, c1, c2, c3], axis=-1).astype(np.uint32)


def fnv1a32(name):
    """The tensor stream of a parameter: 32-bit FNV-1a of its name's UTF-8 bytes."""
    h = 0x811C9DC5
    for byte in name.encode("utf-8"):
        h ^= byte
        h = (h * 0x01000193) & 0xFFFFFFFF
    return h


ELEMENTS_PER_BLOCK = 8


def rounding_bits(seed, stream, step, n, first=0):
    """The 16 random bits of elements first..first+n-1 of one tensor at one
    step (uint32 values in [0, 2^16)).

    Element e uses Philox block b = e // 8 with
      counter = (b mod 2^32, b div 2^32, step mod 2^32, stream XOR (step div 2^32))
      key     = (seed mod 2^32, seed div 2^32)
    and takes word e mod 4 of the block: its low 16 bits when e mod 8 < 4,
    its high 16 bits otherwise.
    """
    if n == 0:
        return np.zeros(0, dtype=np.uint32)
    b0 = first // ELEMENTS_PER_BLOCK
    b1 = (first + n - 1) // ELEMENTS_PER_BLOCK + 1
    blocks = b1 - b0
    b = np.arange(b0, b1, dtype=np.uint64)
    counter = np.empty((blocks, 4), dtype=np.uint32)
    counter[:, 0] = (b & _MASK32).astype(np.uint32)
    counter[:, 1] = (b >> np.uint64(32)).astype(np.uint32)
    counter[:, 2] = step & 0xFFFFFFFF
    counter[:, 3] = (stream ^ (step >> 32)) & 0xFFFFFFFF
    words = philox4x32(counter, [seed & 0xFFFFFFFF, seed >> 32])  # [blocks, 4]
    low = words & np.uint32(0xFFFF)
    high = words >> np.uint32(16)
    bits = np.concatenate([low, high], axis=1).reshape(-1)  # per block: 4 low halves, then 4 high halves
    skip = first - b0 * ELEMENTS_PER_BLOCK
    return bits[skip:skip + n].astype(np.uint32)
