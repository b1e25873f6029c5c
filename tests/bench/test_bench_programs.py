"""Every benchmark program runs end to end on a tiny workload and, with ``--json``, prints its figures as one
JSON object on its last line (the figures themselves are for people: no test asserts on time)."""
from __future__ import annotations

import json
import subprocess

import pytest

BENCHES = {
    "bench.pipeline": (["--clicks", "2000", "--rate", "200", "--seconds", "1"],
                       {"clicks_per_s", "queries_per_s", "join_p50_ms", "join_p90_ms", "join_p99_ms",
                        "registry_ids_per_command"}),
    "bench.registry": (["--clients", "1", "--duration", "1", "--half-duration", "1", "--light-duration", "0.5",
                        "--race-duration", "0.5", "--memory-ids", "20000"],
                       {"ids_per_s", "commit_p50_ms", "commit_p99_ms", "light_commit_p50_ms", "ids_per_command",
                        "bytes_per_id"}),
    "bench.verify": (["--sizes", "2000", "--lost", "20"],
                     {"verify_events_per_s_2k", "verify_read_s_2k", "verify_join_s_2k", "recover_end_to_end_s",
                      "recovered"}),
    "bench.millwheel": (["--rate", "200", "--seconds", "1", "--records", "2000"],
                        {"records_per_s", "delay_p50_ms_eo_on", "delay_p95_ms_eo_off",
                         "stage1_watermark_lag_ms"}),
}


@pytest.mark.slow
@pytest.mark.timeout(300)
@pytest.mark.parametrize("module", sorted(BENCHES))
def test_bench_prints_its_figures_as_json_on_the_last_line(module, procs):
    args, keys = BENCHES[module]
    p = procs.python("-m", module, *args, "--json", stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    out, _ = p.communicate(timeout=240)
    text = out.decode(errors="replace")
    assert p.returncode == 0, text[-3000:]
    figures = json.loads(text.strip().splitlines()[-1])
    assert keys <= set(figures), sorted(keys - set(figures))
    rates = [k for k in figures if k.endswith("_per_s") and isinstance(figures[k], (int, float))]
    assert rates and all(figures[k] > 0 for k in rates), {k: figures[k] for k in rates}
    assert figures.get("duplicates", 0) == 0 and figures.get("duplicates_in_output", 0) == 0
