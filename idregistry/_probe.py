"""Measuring how compactly a shard holds its ids (for the benchmark): fills a fresh
:class:`~idregistry._state.ShardState` in this process and counts the bytes it holds."""
from __future__ import annotations

import gc
import time

import psutil

from idregistry._state import OP_ADVANCE_GC, OP_CLEAR_TOKENS, OP_COMMIT, ShardState, bucket_width_us


def measure_state_memory(n_ids: int = 5_000_000, processes: int = 200, gc_after_s: float = 3 * 86400.0,
                         span_s: float = 3600.0, batch: int = 5000, clear_tokens: bool = True,
                         ids_per_token: int = 0, churn: float = 0.0) -> dict:
    """Commit ``n_ids`` ids (from ``processes`` event-producing processes, spread over ``span_s`` seconds
    of event time) into one shard's state through its replicated-command path and report the bytes held
    per id: by object accounting (``sys.getsizeof`` of everything the state holds) and by the growth of
    this process's resident memory.

    Every commit carries a registration time, as the replicated commands do (one time per live token).
    Tokens: by default one token per 100,000 ids, cleared after each batch of ``batch`` ids. With
    ``ids_per_token`` > 0, the pipeline's real pattern instead: one joiner-style token
    (``host:port/pid/start_us/seq``) per join request of that many ids, never cleared.

    With ``churn`` > 0, ``n_ids * (1 + churn)`` ids go through while garbage collection keeps about the
    newest ``span_s`` seconds (about ``n_ids`` ids) held, as a long-running registry does: the figure is
    then per id still held, with whatever the dropped ids left behind counted in."""
    state = ShardState(0, bucket_width_us(span_s if churn > 0 else gc_after_s))
    total = int(n_ids * (1 + max(0.0, churn)))
    span_us = int(span_s * 1e6)
    start_us = 1_763_712_000_000_000
    step = max(1, int(span_s * 1e6 / max(1, n_ids // processes)))
    prefixes = [f"10.{p // 250}.{p % 250}.7:{4000 + p}:" for p in range(processes)]
    gc.collect()
    rss0 = psutil.Process().memory_info().rss
    t0 = time.perf_counter()
    done = 0
    while done < total:
        k = min(batch, total - done)
        ids = [f"{prefixes[(done + i) % processes]}{start_us + ((done + i) // processes) * step:016d}"
               for i in range(k)]
        now_us = start_us + (done // processes) * step     # the leader's clock, as the command carries it
        if ids_per_token > 0:
            for at in range(0, k, ids_per_token):
                seq = (done + at) // ids_per_token
                state.apply([(OP_COMMIT, f"127.0.0.1:{40000 + seq % 7}/{31000 + seq % 7}/1763712000123456/{seq}",
                              ids[at:at + ids_per_token], now_us)])
        else:
            state.apply([(OP_COMMIT, f"joiner-{done // 100000}", ids, now_us)])
            if clear_tokens:
                state.apply([(OP_CLEAR_TOKENS, ids)])
        done += k
        if churn > 0:
            state.apply([(OP_ADVANCE_GC, start_us + ((done - 1) // processes) * step - span_us)])
    elapsed = time.perf_counter() - t0
    del ids
    gc.collect()
    rss = psutil.Process().memory_info().rss - rss0
    held = state.approx_bytes()
    return {"ids": state.ids_held, "ids_committed": total, "bytes": held, "bytes_per_id": round(held / max(1, state.ids_held), 2),
            "rss_bytes_per_id": round(rss / max(1, state.ids_held), 2), "processes": processes,
            "buckets": len(state.buckets), "tokens": len(state.token_numbers), "build_s": round(elapsed, 2)}
