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

    # add and might_contain inline the positions (no generator): they run once or twice per record
    def add(self, item: str) -> None:
        h1, h2 = mmh3.hash64(item, signed=False)
        arr, bits = self._array, self.bits
        for i in range(self.hashes):
            p = (h1 + i * h2) % bits
            arr[p >> 3] |= 1 << (p & 7)
        self.count += 1

    def might_contain(self, item: str) -> bool:
        h1, h2 = mmh3.hash64(item, signed=False)
        arr, bits = self._array, self.bits
        for i in range(self.hashes):
            p = (h1 + i * h2) % bits
            if not arr[p >> 3] & (1 << (p & 7)):
                return False
        return True

    @property
    def full(self) -> bool:
        return self.count >= self.capacity
