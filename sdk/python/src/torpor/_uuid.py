"""uuid v7 (RFC 9562), which Python 3.11's uuid module lacks."""

from __future__ import annotations

import os
import time
import uuid

__all__ = ["uuid7"]


def uuid7() -> uuid.UUID:
    """A fresh uuid v7: 48 bits of Unix milliseconds, then 74 random bits
    (version 7, variant 10): ordered by time, unique by chance."""
    ms = time.time_ns() // 1_000_000
    rnd = int.from_bytes(os.urandom(10), "big")  # 80 bits, 74 used
    value = (ms & ((1 << 48) - 1)) << 80
    value |= 0x7 << 76  # version
    value |= ((rnd >> 62) & 0xFFF) << 64  # rand_a, 12 bits
    value |= 0b10 << 62  # variant
    value |= rnd & ((1 << 62) - 1)  # rand_b, 62 bits
    return uuid.UUID(int=value)
