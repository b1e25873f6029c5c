"""Timestamps in packed decimal: the 16 digits of a Photon id's timestamp as the nibbles of one unsigned
64-bit integer, the first digit the highest (``int(digits, 16)``).

The event store's cache keeps a timed block's timestamps so (see ``eventstore._state.EventCache``): a whole
chunk's are made by one ``bytes.fromhex``, no ``int`` per id, and for 16-digit texts packed values compare
and are equal exactly as the numbers do, which is all its timelines and bisections need. Values shown
outside (read positions, map entries) are unpacked one at a time.
"""
from __future__ import annotations

import sys
from array import array

_BIG_ENDIAN = sys.byteorder == "big"


def packed_times(digits: str) -> array:
    """The timestamps whose 16-digit decimal texts are concatenated in ``digits`` (ASCII digits only), as
    *packed decimal*: each digit one nibble of a 64-bit unsigned integer, the first digit the highest
    (``int(text, 16)`` of the text). One C call for a whole chunk, no ``int`` per timestamp. Packed values of
    16-digit texts compare, and are equal, exactly as the numbers do, which is all the cache's timelines and
    bisections need; :func:`unpack_time` gives the number back (read positions, map entries)."""
    packed = array("Q", bytes.fromhex(digits))
    if not _BIG_ENDIAN:
        packed.byteswap()
    return packed


def pack_time(ts: int) -> int:
    """``ts`` (µs, at most 16 digits) in packed decimal (see :func:`packed_times`); a longer ``ts`` packs
    above every 16-digit one, so order is still kept."""
    return int(f"{ts:016d}", 16)


def unpack_time(packed: int) -> int:
    """The timestamp (µs) of a packed decimal value (see :func:`packed_times`)."""
    return int(f"{packed:016x}")
