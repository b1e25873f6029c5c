"""Measuring how compactly a shard holds its ids (for the benchmark): fills a fresh
:class:`~idregistry._state.ShardState` in this process and counts the bytes it holds."""
from __future__ import annotations

import gc
import time

import psutil

from idregistry._state import OP_CLEAR_TOKENS, OP_COMMIT, ShardState, bucket_width_us


def measure_state_memory(n_ids: int = 5_000_000, processes: int = 200, gc_after_s: float = 3 * 86400.0,
                         span_s: float = 3600.0, batch: int = 5000, clear_tokens: bool = True) -> dict:
    """Commit ``n_ids`` ids (from ``processes`` event-producing processes, spread over ``span_s`` seconds
    of event time) into one shard's state through its replicated-command path, clear their tokens, and
    report the bytes held per id: by object accounting (``sys.getsizeof`` of everything the state holds)
    and by the growth of this process's resident memory."""
    state = ShardState(0, bucket_width_us(gc_after_s))
    start_us = 1_763_712_000_000_000
    step = max(1, int(span_s * 1e6 / max(1, n_ids // processes)))
    prefixes = [f"10.{p // 250}.{p % 250}.7:{4000 + p}:" for p in range(processes)]
    gc.collect()
    rss0 = psutil.Process().memory_info().rss
    t0 = time.perf_counter()
    done = 0
    while done < n_ids:
        k = min(batch, n_ids - done)
        ids = [f"{prefixes[(done + i) % processes]}{start_us + ((done + i) // processes) * step:016d}"
               for i in range(k)]
        state.apply([(OP_COMMIT, f"joiner-{done // 100000}", ids)])
        if clear_tokens:
            state.apply([(OP_CLEAR_TOKENS, ids)])
        done += k
    elapsed = time.perf_counter() - t0
    del ids
    gc.collect()
    rss = psutil.Process().memory_info().rss - rss0
    held = state.approx_bytes()
    return {"ids": state.ids_held, "bytes": held, "bytes_per_id": round(held / max(1, state.ids_held), 2),
            "rss_bytes_per_id": round(rss / max(1, state.ids_held), 2), "processes": processes,
            "buckets": len(state.buckets), "build_s": round(elapsed, 2)}
