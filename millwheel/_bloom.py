"""A Bloom filter over record ids: the dedup fast path (paper §6.1.1).

``might_contain`` false means the id was certainly never added, so the store need not be asked; true
means "ask the store" (the truth). No deletion: the shell rebuilds the filter from the store when it
has filled past its design capacity, which also drops ids garbage collected since.

It is a blocked filter: all of an id's bits are in one 64-bit word (the word from one half of the id's
64+64-bit murmur hash, the bits from 6-bit fields of the other half), so adding or testing an id is one
read of one word, with the mask made from a table, instead of one bit (and one cache line) per hash,
each set or tested in its own Python step. One word per id fills some words more than others, so for
the same false positive rate it takes more bits than a classic filter: it is sized at ``WORD_BITS_FACTOR``
times the classic size (at 1% asked, measured 0.6% at capacity), with at most ``MAX_HASHES`` bits an id.
"""
from __future__ import annotations

import math
from array import array

import mmh3

WORD_BITS_FACTOR = 1.5
"""Bits of the filter over the classic filter's for the same capacity and rate (see the module docstring)."""
MAX_HASHES = 10
"""An id's bits: at most ten 6-bit fields of a 64-bit hash."""

_PAIR = tuple((1 << (x & 63)) | (1 << (x >> 6)) for x in range(4096))   # a 12-bit field's two bits
_ONE = tuple(1 << x for x in range(64))


class BloomFilter:
    def __init__(self, capacity: int = 1_000_000, false_positive_rate: float = 0.01) -> None:
        if capacity <= 0 or not 0 < false_positive_rate < 1:
            raise ValueError("capacity must be positive and false_positive_rate in (0, 1)")
        self.capacity = capacity
        classic = -capacity * math.log(false_positive_rate) / (math.log(2) ** 2)
        self.hashes = min(MAX_HASHES, max(1, round(classic / capacity * math.log(2))))
        self.words = max(1, math.ceil(WORD_BITS_FACTOR * classic / 64))
        self.bits = 64 * self.words
        self._words = array("Q", bytes(8 * self.words))
        # the mask is made from 12-bit fields (two bits each, from the table) and one 6-bit field if the
        # number of bits is odd: the same bits as one 6-bit field after the other (``_word_and_mask``)
        self._pairs = tuple(12 * i for i in range(self.hashes // 2))
        self._single = 12 * (self.hashes // 2) if self.hashes % 2 else None
        self.count = 0

    def _word_and_mask(self, item: str) -> tuple[int, int]:
        """The word of ``item`` and its bits in it, one 6-bit field of the hash after the other: the
        reference for :meth:`add_many`, :meth:`might_contain` and :meth:`might_contain_many`."""
        h1, h2 = mmh3.hash64(item, signed=False)
        mask = 0
        for i in range(self.hashes):
            mask |= 1 << ((h2 >> (6 * i)) & 63)
        return h1 % self.words, mask

    def add(self, item: str) -> None:
        self.add_many((item,))

    # add_many and might_contain_many inline the mask (names bound once for all the ids of a call)
    def add_many(self, items) -> None:
        """``add`` each of ``items``."""
        words, n_words, hash64, pair, one = self._words, self.words, mmh3.hash64, _PAIR, _ONE
        pairs, single = self._pairs, self._single
        n = 0
        for item in items:
            h1, h2 = hash64(item, signed=False)
            mask = 0
            for s in pairs:
                mask |= pair[(h2 >> s) & 4095]
            if single is not None:
                mask |= one[(h2 >> single) & 63]
            words[h1 % n_words] |= mask
            n += 1
        self.count += n

    def might_contain(self, item: str) -> bool:
        return self.might_contain_many((item,))[0]

    def might_contain_many(self, items) -> list[bool]:
        """``[might_contain(item) for item in items]``."""
        words, n_words, hash64, pair, one = self._words, self.words, mmh3.hash64, _PAIR, _ONE
        pairs, single = self._pairs, self._single
        out = []
        for item in items:      # field by field, out at the first bit not set (most ids asked are new)
            h1, h2 = hash64(item, signed=False)
            word = words[h1 % n_words]
            seen = True
            for s in pairs:
                m = pair[(h2 >> s) & 4095]
                if word & m != m:
                    seen = False
                    break
            else:
                if single is not None:
                    m = one[(h2 >> single) & 63]
                    seen = word & m == m
            out.append(seen)
        return out

    @property
    def full(self) -> bool:
        return self.count >= self.capacity
