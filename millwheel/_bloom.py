"""A Bloom filter over record ids: the dedup fast path (paper §6.1.1).

``might_contain`` false means the id was certainly never added, so the store need not be asked; true
means "ask the store" (the truth). No deletion: the shell rebuilds the filter from the store when it
has filled past its design capacity, which also drops ids garbage collected since.
"""
from __future__ import annotations

import math

import mmh3


class BloomFilter:
    def __init__(self, capacity: int = 1_000_000, false_positive_rate: float = 0.01) -> None:
        if capacity <= 0 or not 0 < false_positive_rate < 1:
            raise ValueError("capacity must be positive and false_positive_rate in (0, 1)")
        self.capacity = capacity
        self.bits = max(64, int(-capacity * math.log(false_positive_rate) / (math.log(2) ** 2)))
        self.hashes = max(1, round(self.bits / capacity * math.log(2)))
        self._array = bytearray((self.bits + 7) // 8)
        self.count = 0

    def _positions(self, item: str) -> list[int]:
        h1, h2 = mmh3.hash64(item, signed=False)
        bits = self.bits
        return [(h1 + i * h2) % bits for i in range(self.hashes)]

    # add, add_many and might_contain inline the positions (no generator; they run once or twice per
    # record) and step from one to the next: (h1 + i * h2) % bits is (h1 % bits + i * (h2 % bits)) % bits,
    # the same positions as _positions with an addition per hash instead of a product and a division
    def add(self, item: str) -> None:
        self.add_many((item,))

    def add_many(self, items) -> None:
        """``add`` each of ``items`` (names bound once for all of them)."""
        arr, bits, hashes, hash64 = self._array, self.bits, range(self.hashes), mmh3.hash64
        n = 0
        for item in items:
            h1, h2 = hash64(item, signed=False)
            p, step = h1 % bits, h2 % bits
            for _ in hashes:
                arr[p >> 3] |= 1 << (p & 7)
                p += step
                if p >= bits:
                    p -= bits
            n += 1
        self.count += n

    def might_contain(self, item: str) -> bool:
        h1, h2 = mmh3.hash64(item, signed=False)
        arr, bits = self._array, self.bits
        p, step = h1 % bits, h2 % bits
        for _ in range(self.hashes):
            if not arr[p >> 3] & (1 << (p & 7)):
                return False
            p += step
            if p >= bits:
                p -= bits
        return True

    @property
    def full(self) -> bool:
        return self.count >= self.capacity
