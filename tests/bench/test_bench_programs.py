"""Every benchmark program runs end to end on a tiny workload and, with ``--json``, prints its figures as one
JSON object on its last line (the figures themselves are for people: no test asserts on time)."""
from __future__ import annotations

import json
import subprocess

import pytest

BENCHES = {
    "bench.dispatcher": (["--clicks", "3000", "--files", "6", "--objects", "200"],
                         {"local_lines_per_s", "s3_lines_per_s", "incremental_poll_ms", "incremental_poll_requests",
                          "full_list_ms", "catchup_clicks_per_s", "catchup_sent_to_joiners_fraction"}),
    "bench.dispatcher_core": (["--queries", "20000", "--runs", "1"],
                              {"click_lines", "gc_default_cpu_us_per_click", "gc_settle_cpu_us_per_click",
                               "gc_default_clicks_per_s", "gc_settle_clicks_per_s", "checkpoint_bytes_per_click"}),
    "bench.pipeline": (["--clicks", "2000", "--rate", "200", "--seconds", "1"],
                       {"clicks_per_s", "queries_per_s", "join_p50_ms", "join_p90_ms", "join_p99_ms", "published_p50_ms",
                        "published_p90_ms", "steady_rate_clicks_per_s",
                        "registry_ids_per_command"}),
    "bench.registry": (["--clients", "1", "--duration", "1", "--half-duration", "1", "--light-duration", "0.5",
                        "--race-duration", "0.5", "--memory-ids", "20000", "--replica-memory-ids", "20000"],
                       {"ids_per_s", "commit_p50_ms", "commit_p99_ms", "light_commit_p50_ms", "ids_per_command",
                        "bytes_per_id", "pipeline_tokens_bytes_per_id", "tokens_of_300_ids_bytes_per_id",
                        "replica_rss_bytes_per_id", "replica_anon_bytes_per_id"}),
    "bench.eventstore": (["--mb", "2", "--seconds", "0.3", "--hit-queries", "20000", "--cache-mb", "0.5"],
                         {"cache_lookups_per_s", "cache_batch100_p99_ms", "logs_warm_lookups_per_s",
                          "logs_cold_batch10_p99_ms", "hit_ratio", "map_entries_per_gb", "restart_to_full_speed_s",
                          "cache_bytes_per_event"}),
    "bench.regions": (["--rtts", "0,30", "--backlog", "300", "--rate", "100", "--seconds", "2", "--outage-s", "3",
                       "--timeout", "120"],
                      {"distance", "rtt0ms_clicks_joined_per_s", "rtt30ms_clicks_joined_per_s", "rtt30ms_join_p50_ms",
                       "rtt30ms_join_p90_ms", "rtt30ms_join_p99_ms", "rtt30ms_backlog_clicks_joined_per_s",
                       "rtt30ms_registry_ids_per_command", "rtt30ms_wasted_joins", "rtt30ms_catch_up_s",
                       "rtt30ms_outage_join_p50_ms", "rtt30ms_outage_b_share_p50_ms", "rtt30ms_share_a",
                       "target_throughput_met", "target_latency_met"}),
    "bench.sql": (["--rates", "200", "--seconds", "1", "--rows", "20000", "--files", "4"],
                  {"published_p50_ms", "published_p90_ms", "files_per_joiner_hour", "groupby_jsonl_s",
                   "groupby_parquet_s", "groupby_jsonl_rows_per_s", "groupby_parquet_rows_per_s"}),
    "bench.tailer": (["--queries", "20000", "--runs", "1"],
                     {"input_lines", "this_poll_ns_per_line", "this_lines_ns_per_line", "this_poll_lines_per_s"}),
    "bench.verify": (["--sizes", "2000", "--lost", "20"],
                     {"verify_2k_events_per_s", "verify_2k_read_s", "verify_2k_join_s", "recover_end_to_end_s",
                      "recovered", "verify_2k_from_cold_start_s", "verify_2k_cold_spark_start_s",
                      "verify_2k_jvm_cpu_s", "verify_2k_cold_jvm_cpu_s", "verify_2k_cold_jvm_start_cpu_s",
                      "verify_2k_spark_jobs", "verify_2k_cold_spark_jobs", "verify_2k_cold_class_archive", "verify_2k_cold_launch",
                      "verify_2k_cold_job_jit_cpu_s", "verify_2k_cold_job_tasks_cpu_s", "verify_2k_cold_codegen_classes",
                      "verify_2k_cold_before_first_job_s", "verify_2k_cold_spark_jobs_s", "verify_2k_cold_between_jobs_s",
                      "verify_2k_cold_after_jobs_s", "verify_2k_cold_stage_task_cpu_s"}),
    "bench.millwheel": (["--rate", "200", "--seconds", "1", "--records", "2000"],
                        {"records_per_s", "delay_p50_ms_eo_on", "delay_p95_ms_eo_off",
                         "stage1_watermark_lag_ms", "records_per_s_postgres", "records_per_s_sqlite",
                         "cache_hit_ratio_postgres", "cache_hit_ratio_sqlite"}),
}


@pytest.mark.slow
@pytest.mark.timeout(300)
@pytest.mark.parametrize("module", sorted(BENCHES))
def test_bench_prints_its_figures_as_json_on_the_last_line(module, procs):
    args, keys = BENCHES[module]
    p = procs.python("-m", module, *args, "--json", stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    out, err = p.communicate(timeout=240)
    text = out.decode(errors="replace")
    assert p.returncode == 0, (text + err.decode(errors="replace"))[-3000:]
    assert text.strip(), err.decode(errors="replace")[-3000:]
    figures = json.loads(text.strip().splitlines()[-1])          # the last line of stdout, whatever stderr says
    assert keys <= set(figures), sorted(keys - set(figures))
    rates = [k for k in figures if k.endswith("_per_s") and isinstance(figures[k], (int, float))]
    assert rates and all(figures[k] > 0 for k in rates), {k: figures[k] for k in rates}
    assert figures.get("duplicates", 0) == 0 and figures.get("duplicates_in_output", 0) == 0


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_bench_registry_at_a_distance_places_the_replicas_in_network_namespaces(procs):
    from bench.netns import delay_kind, namespaces_refused
    refused = namespaces_refused()
    if refused is not None or delay_kind() is None:
        pytest.skip(refused or "no way to delay packets here (see bench.netns.delay_refused)")
    p = procs.python("-m", "bench.registry", "--rtt-ms", "40", "--clients", "1", "--threads", "2", "--batch", "100",
                     "--duration", "1", "--half-duration", "0", "--light-duration", "1", "--race-duration", "0.5",
                     "--memory-ids", "0", "--replica-memory-ids", "0", "--json",
                     stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    out, _ = p.communicate(timeout=240)
    text = out.decode(errors="replace")
    assert p.returncode == 0, text[-3000:]
    figures = json.loads(text.strip().splitlines()[-1])
    assert figures["distance"].startswith("netns")
    assert figures["light_commit_p50_ms"] >= 40          # a commit waits for a replica one round trip away
    assert figures["ids_per_s"] > 0 and figures["duplicates"] == 0 and figures["accepted_equals_held"]


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_bench_dispatcher_core_with_the_store_behind_holds_clicks_back_and_joins_them_all(procs):
    """``--store-behind``: the simulated store's answers carry its position, so the core holds clicks back for it
    and releases them; every click is joined in the end, as many as when the store has read everything."""
    figures = {}
    for behind in ("0", "2"):
        p = procs.python("-m", "bench.dispatcher_core", "--queries", "20000", "--runs", "1", "--store-behind", behind,
                         "--json", stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        out, err = p.communicate(timeout=240)
        assert p.returncode == 0, (out + err).decode(errors="replace")[-3000:]
        figures[behind] = json.loads(out.decode().strip().splitlines()[-1])
    assert figures["0"]["held_for_store_per_click"] == 0
    assert figures["2"]["held_for_store_per_click"] > 0
    assert figures["2"]["joined"] == figures["0"]["joined"] > 0
