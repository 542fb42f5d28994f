"""Philox4x32 against Random123's published known answers, and the map from
(seed, step, tensor stream, element) to an element's 16 random bits."""

import numpy as np
import pytest

from skewadam_reference import philox

# Random123's kat_vectors: philox4x32, rounds, counter, key, result.
KNOWN_ANSWERS = [
    (7, [0, 0, 0, 0], [0, 0], [0x5F6FB709, 0x0D893F64, 0x4F121F81, 0x4F730A48]),
    (7, [0xFFFFFFFF] * 4, [0xFFFFFFFF] * 2, [0x5207DDC2, 0x45165E59, 0x4D8EE751, 0x8C52F662]),
    (7, [0x243F6A88, 0x85A308D3, 0x13198A2E, 0x03707344], [0xA4093822, 0x299F31D0],
     [0x4DFCCABA, 0x190A87F0, 0xC47362BA, 0xB6B5242A]),
    (10, [0, 0, 0, 0], [0, 0], [0x6627E8D5, 0xE169C58D, 0xBC57AC4C, 0x9B00DBD8]),
    (10, [0xFFFFFFFF] * 4, [0xFFFFFFFF] * 2, [0x408F276D, 0x41C83B0E, 0xA20BC7C6, 0x6D5451FD]),
    (10, [0x243F6A88, 0x85A308D3, 0x13198A2E, 0x03707344], [0xA4093822, 0x299F31D0],
     [0xD16CFE09, 0x94FDCCEB, 0x5001E420, 0x24126EA1]),
]


@pytest.mark.parametrize("rounds, counter, key, expected", KNOWN_ANSWERS)
def test_known_answers(rounds, counter, key, expected):
    got = philox.philox4x32(np.array(counter, dtype=np.uint32), key, rounds=rounds)
    assert [int(w) for w in got] == expected


def test_vectorised_blocks_equal_one_at_a_time():
    counters = np.array([[k, k >> 3, 7 * k, 0xDEADBEEF ^ k] for k in range(50)], dtype=np.uint32)
    together = philox.philox4x32(counters, [0x12345678, 0x9ABCDEF0])
    for k in range(50):
        assert np.array_equal(together[k], philox.philox4x32(counters[k], [0x12345678, 0x9ABCDEF0]))


def test_fnv1a_published_vectors():
    # FNV-1a, 32 bits (Fowler, Noll and Vo's test suite)
    assert philox.fnv1a32("") == 0x811C9DC5
    assert philox.fnv1a32("a") == 0xE40C292C
    assert philox.fnv1a32("foobar") == 0xBF9CF968


def test_element_bits_come_from_their_block_word_and_half():
    seed, stream, step = 0x0123456789ABCDEF, philox.fnv1a32("blocks.1.moe.experts.w1"), (5 << 32) + 17
    bits = philox.rounding_bits(seed, stream, step, 37)
    for e in range(37):
        counter = [e // 8, 0, step & 0xFFFFFFFF, stream ^ (step >> 32)]
        word = int(philox.philox4x32(np.array(counter, dtype=np.uint32), [seed & 0xFFFFFFFF, seed >> 32])[e % 4])
        assert int(bits[e]) == (word >> 16 if e % 8 >= 4 else word & 0xFFFF)


def test_elements_beyond_2_to_the_35():
    # element 8 * 2^32 + 5 is in block 2^32: counter words (0, 1, ...), word 1, high half
    seed, stream, step = 0x5EED5EED, 77, 3
    e = 8 * (1 << 32) + 5
    word = int(philox.philox4x32(np.array([0, 1, step, stream], dtype=np.uint32), [seed, 0])[1])
    assert int(philox.rounding_bits(seed, stream, step, 1, first=e)[0]) == word >> 16
    # and a range that starts inside a block equals the same elements of a longer range
    assert np.array_equal(philox.rounding_bits(seed, stream, step, 20, first=13),
                          philox.rounding_bits(seed, stream, step, 33)[13:])


def test_every_key_part_changes_the_bits():
    base = philox.rounding_bits(1, 2, 3, 64)
    for other in (philox.rounding_bits(9, 2, 3, 64), philox.rounding_bits(1, 9, 3, 64),
                  philox.rounding_bits(1, 2, 9, 64), philox.rounding_bits(1 << 40, 2, 3, 64),
                  philox.rounding_bits(1, 2, 3 + (1 << 32), 64)):
        assert np.mean(base != other) > 0.9
    assert base.max() < 1 << 16
