"""The ``photon`` command line: gen, run, demo, sql, compact, verify, recover, status, config, registry,
region, certs, eventstore.

It lives in the launcher layer (:mod:`photon.app`), above every room, and imports them directly."""
from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import sys
import time
from pathlib import Path

if sys.argv[1:2] == ["run"] and (__name__ == "__main__" or os.path.basename(sys.argv[0]) == "photon"):
    # `photon run` (python -m photon.app.cli, or the installed script): its fork server imports the services'
    # modules while this process imports its own (photon.app._forkserver.start_early)
    from photon.app._forkserver import start_early
    start_early()

import orjson

import dispatcher
import idregistry
import joiner
from photon import ConfigError, describe_options, folder_unmade, load_config
from photon.app._gen import ID_STYLES, GenOptions, generate
from photon.app._launcher import AlreadyRunning, Launcher, RunOptions
from photon.app._summary import build_summary, dumps, format_summary

EXIT_LOST = 5
"""``photon run`` lost clicks in this run: registered yet in no output (found by reconciling the registry
with the output at catch-up), recorded in a lost-ids ledger, or unrecorded by a stopping joiner. It wins
over every other code of the run (caught up, stopped, timed out or interrupted)."""


def _cmd_gen(args) -> int:
    regions = tuple(r.strip() for r in args.regions.split(",") if r.strip())
    opts = GenOptions(out=args.out, queries=args.queries, clicks_per_query=args.clicks_per_query,
                      regions=regions, writers=args.writers, rotate_lines=args.rotate_lines,
                      unjoinable_fraction=args.unjoinable, duplicate_fraction=args.duplicates,
                      bad_line_fraction=args.bad_lines, seed=args.seed, unjoinable_after_s=args.unjoinable_after_s,
                      id_style=args.ids)
    t0 = time.monotonic()
    s = generate(opts)
    if args.json:
        from dataclasses import asdict
        print(json.dumps({**asdict(s), "regions": list(s.regions), "truth": str(Path(args.out).resolve() / "truth"),
                          "seconds": round(time.monotonic() - t0, 3)}, sort_keys=True), flush=True)
        return 0
    print(f"wrote {s.queries} queries and {s.clicks_lines} click lines ({s.joinable_clicks} joinable, "
          f"{s.unjoinable_clicks} unjoinable, {s.duplicate_click_lines} duplicated lines, "
          f"{s.bad_query_lines + s.bad_click_lines} bad lines) for region(s) {', '.join(s.regions)} "
          f"in {time.monotonic() - t0:.1f} s")
    print(f"config: {s.config}")
    print(f"truth:  {Path(args.out).resolve() / 'truth'}")
    return 0


def _run(config, until_caught_up: bool, timeout_s, as_json: bool, regions=None,
         compact: bool = False, with_options=None) -> tuple[int, dict]:
    opts = RunOptions(until_caught_up=until_caught_up, timeout_s=timeout_s, regions=regions, compact=compact)
    if with_options is not None:         # e.g. the demo's drill, which stops the run when it is done
        with_options(opts)

    def on_signal(signum, _frame):
        opts.stop_requested.append(signum)

    signal.signal(signal.SIGINT, on_signal)
    signal.signal(signal.SIGTERM, on_signal)
    launcher = Launcher(config, opts)
    started_us = time.time_ns() // 1000
    code = launcher.run()
    elapsed = time.monotonic() - launcher.started_at
    summary = build_summary(config, elapsed, regions, since_us=started_us,
                            reconciliation=_reconciliation(config, launcher, started_us))
    code = run_exit_code(code, summary)
    if code == EXIT_LOST:
        print(f"photon: {summary['total']['lost_in_run']} click(s) lost in this run, awaiting recovery (exit "
              f"{EXIT_LOST}): run `photon verify --config {config.path}` and then `photon recover --config "
              f"{config.path}` (no pipeline needs to run)", file=sys.stderr)
    summary["exit_code"] = code
    print(format_summary(summary), flush=True)
    if as_json:
        print(dumps(summary), flush=True)
    return code, summary


def run_exit_code(code: int, summary: dict) -> int:
    """``photon run``'s exit code: :data:`EXIT_LOST` when its summary counts a click lost in the run (see
    :mod:`photon.app._summary`), else the launcher's ``code``."""
    return EXIT_LOST if summary["total"].get("lost_in_run") else code


def _reconciliation(config, launcher: Launcher, started_us: int):
    """The registry export taken at catch-up compared with the output (None when none was taken: the run
    did not catch up). Its failure is reported in the summary, never raised."""
    from photon.app._reconcile import Reconciliation, reconcile
    if launcher.registry_export is None:
        return Reconciliation(started_us, error=launcher.export_error) if launcher.export_error else None
    try:
        return reconcile(config, launcher.registry_export, started_us, launcher.joiner_regions(), echo=launcher.echo)
    except Exception as e:  # noqa: BLE001  (an unreadable export or output: said in the summary)
        return Reconciliation(started_us, error=f"{type(e).__name__}: {e}")
    finally:
        shutil.rmtree(launcher.registry_export, ignore_errors=True)


def _cmd_run(args) -> int:
    config = load_config(args.config)
    names = [r.strip() for part in (args.region or []) + ([args.regions] if args.regions else [])
             for r in part.split(",") if r.strip()]
    regions = list(dict.fromkeys(names)) or None
    if regions:
        for r in regions:
            config.region(r)
    return _run(config, args.until_caught_up, args.timeout, args.json, regions, args.compact)[0]


def _cmd_demo(args) -> int:
    from photon.app._demo import DEMO_REGISTRY_REGION, OutageDrill
    out = Path(args.dir).resolve()
    print(f"photon demo: generating {args.queries} queries (~{int(args.queries * 0.1)} clicks) for regions "
          f"a and b under {out}", flush=True)
    s = generate(GenOptions(out=str(out), queries=args.queries, regions=("a", "b"), unjoinable_after_s=5.0))
    for sub in ("out", "state"):
        shutil.rmtree(out / sub, ignore_errors=True)
    with open(s.config, "a") as f:
        f.write(DEMO_REGISTRY_REGION)
    config = load_config(s.config)
    print(f"photon demo: regions a and b join their own copies of the logs through one IdRegistry spread over "
          f"a, b and c (5 replicas, 2/2/1); region b is taken down mid-run and brought back "
          f"(expect {s.joinable_clicks} joined once in all, {s.unjoinable_clicks} unjoinable)", flush=True)
    drill = None
    if not args.no_outage:
        drill = OutageDrill(config, "b", lambda m: print(f"photon demo: {m}", file=sys.stderr, flush=True))
    # with the drill, the run ends when the drill says so (after verify/recover and the final catch-up)
    code, summary = _run(config, drill is None, args.timeout, False,
                         with_options=drill.start_with if drill else None)
    ids = [orjson.loads(line)[config.join.foreign_id_field]
           for region in config.pipeline_regions for line in region.output_reader("joined", config.s3).lines()]
    joined = set(ids)
    dups = len(ids) - len(joined)
    truth = set((out / "truth" / "joinable.txt").read_text().split())
    print(f"photon demo: {len(joined & truth)}/{len(truth)} joinable clicks in the output, "
          f"{dups} duplicates, {len(joined - truth)} unexpected; wasted joins "
          f"{summary['total'].get('wasted_joins', 0)}")
    if not args.no_sql:
        _demo_query(config)
    if args.json:
        summary["demo"] = {"joinable": len(truth), "joined": len(joined & truth), "duplicates": dups,
                           "unexpected": len(joined - truth),
                           "outage": [text for _, text in drill.events] if drill else [],
                           "verify": drill.figures if drill else {}}
        print(json.dumps(summary, sort_keys=True), flush=True)
    return code if not dups and joined == truth else (code or 1)


def _cmd_sql(args) -> int:
    from photon.app._sql import sql_command
    config = load_config(args.config)
    if args.out is not None:            # checked before Spark starts and the query runs, not when writing its result
        out = Path(args.out)
        if out.is_dir():
            raise ConfigError(f"--out {args.out} is a folder; name the file to write the result to")
        if not out.parent.is_dir():
            raise ConfigError(f"--out {args.out}: folder {out.parent} does not exist")
        if not os.access(out.parent, os.W_OK) or (out.exists() and not os.access(out, os.W_OK)):
            raise ConfigError(f"--out {args.out} is not writable by this user")
    return sql_command(config, args.query, args.format, args.out, args.verbose, args.infer_schemas)


def _cmd_compact(args) -> int:
    from photon.app._compact import compact
    from photon.app._spark import spark_error
    config = load_config(args.config)
    t0 = time.monotonic()
    try:
        st = compact(config, regions=args.regions.split(",") if args.regions else None)
    except Exception as e:
        print(f"photon compact: {spark_error(e, args.verbose)}", file=sys.stderr)
        return 1
    if args.json:
        from dataclasses import asdict
        print(json.dumps({**asdict(st), "seconds": round(time.monotonic() - t0, 3)}, sort_keys=True), flush=True)
        return 0
    print(f"photon compact: {st.partitions_compacted} partition(s), {st.lines_compacted} lines as Parquet "
          f"({st.jsonl_files_swapped} JSONL files swapped out, {st.jsonl_files_deleted} deleted) in "
          f"{time.monotonic() - t0:.1f} s", flush=True)
    return 0


DEMO_QUERY = ("SELECT query.advertiser_id AS advertiser, count(*) AS clicks, "
              "round(sum(cost_micros) / 1e6, 2) AS spend, count(DISTINCT region) AS regions "
              "FROM joined GROUP BY query.advertiser_id ORDER BY spend DESC LIMIT 10")


def _demo_query(config) -> None:
    """The demo's last step: Spark SQL over the joined output of both regions, as `photon sql` runs it."""
    from photon.app._spark import spark_error, spark_session
    from photon.app._sql import run_query
    print(f'photon demo: photon sql --config {config.path} "{DEMO_QUERY}"', flush=True)
    try:
        print(run_query(config, spark_session(config, "photon-demo"), DEMO_QUERY), end="", flush=True)
    except Exception as e:
        print(f"photon demo: the query failed: {spark_error(e)}", file=sys.stderr, flush=True)


def _cmd_status(args) -> int:
    """Exit 0 only when every process of the config answers SERVING (1 otherwise, the reasons named)."""
    from photon import use_tls
    from photon.app._status import format_status, sample, summarize, watch
    config = load_config(args.config)
    use_tls(config)
    if args.watch:
        try:
            watch(config, args.every)
        except KeyboardInterrupt:
            pass
        return 0
    only = [config.region(r.strip()).name for r in args.region.split(",") if r.strip()] if args.region else None
    now, before = sample(config, args.interval, args.timeout)
    status = summarize(config, now, before, only=only)
    if args.json:
        print(json.dumps(status.as_dict(), sort_keys=True, default=str), flush=True)
    else:
        print(format_status(config, now, before))
        _print_local_counters(config)
    if status.nothing_runs:
        print(f"photon status: {status.headline}", file=sys.stderr)
    if not status.ok:
        print(f"photon status: not every process is SERVING ({len(status.problems)} problem(s)): "
              + "; ".join(status.problems[:10]), file=sys.stderr)
    return 0 if status.ok else 1


def _print_local_counters(config) -> None:
    """The run summary and each joiner's counters, for the regions whose state dirs are on this machine."""
    local = [r for r in config.pipeline_regions if Path(r.state_dir).is_dir()]
    if not local:
        return
    print(format_summary(build_summary(config, 0.0)))
    for region in local:
        waiting = (dispatcher.read_status(region.state_dir) or {}).get("waiting_for_disk")
        if waiting:
            print(f"  region {region.name}: dispatcher PAUSED waiting for disk: {waiting}")
    for region in local:
        for name, j in sorted(joiner.read_status(region.state_dir).items()):
            print(f"  joiner {name:<10} requests {j.get('requests', 0):>7}  joined {j.get('joined', 0):>8}  "
                  f"already registered {j.get('already_registered', 0):>6}  not found {j.get('not_found', 0):>6}  "
                  f"throttled {j.get('throttled', 0):>5}  registry errors {j.get('registry_errors', 0)}  "
                  f"in flight {j.get('in_flight', 0)}  lost {j.get('lost_ids', 0)}  "
                  f"unrecorded {j.get('unrecorded_ids', 0)}")
            if j.get("writer_error"):
                print(f"    output writes failing, answering THROTTLED until they work: {j['writer_error']}")


def _cmd_region(args) -> int:
    from photon.app._regions import RegionControlError, check_region_name, region_down, region_up
    config = load_config(args.config)
    check_region_name(config, args.name)
    try:
        if args.action == "down":
            state = region_down(config, args.name, hard=args.hard, wait_s=args.wait)
            if args.json:
                print(json.dumps(state, sort_keys=True))
                return 0
            print(f"region {args.name} is down: {len(state['processes'])} processes "
                  f"{'killed' if args.hard else 'stopped'} ({', '.join(state['processes'])})")
        else:
            state = region_up(config, args.name, wait_s=args.wait)
            if args.json:
                print(json.dumps(state, sort_keys=True))
                return 0
            print(f"region {args.name} is up: {len(state['processes'])} processes started")
    except RegionControlError as e:
        print(f"photon region: {e}", file=sys.stderr)
        return 1
    return 0


def _cmd_certs(args) -> int:
    from photon.app._certs import make_certs
    hosts = [h.strip() for h in args.hosts.split(",") if h.strip()]
    paths = make_certs(args.out, server_name=args.server_name, hosts=hosts)
    print(f"wrote a test CA and a certificate for {args.server_name!r} ({', '.join(hosts)}) into {args.out}; "
          f"add to photon.toml:")
    print("[tls]")
    for key in ("ca", "cert", "key", "raft_secret_file"):
        print(f'{key} = "{paths[key]}"')
    print(f'server_name = "{args.server_name}"')
    return 0


def _cmd_config(args) -> int:
    """``--check FILE``: every error of the file at once (exit 2 if any), then warnings (unreachable S3
    buckets, fixed ports in use here); without it, every option with its default."""
    if args.check is not None:
        args.check = args.check or os.environ.get(ENV_CONFIG) or ""
        if not args.check:
            raise ConfigError(f"--check needs a FILE (or ${ENV_CONFIG})")
        from photon.app._configcheck import check_config_file
        check = check_config_file(args.check, network=not args.offline)
        if args.json:
            print(json.dumps(check.as_dict(), sort_keys=True))
        else:
            for e in check.errors:
                print(f"error: {e}", file=sys.stderr)
            for w in check.warnings:
                print(f"warning: {w}", file=sys.stderr)
            if not check.errors:
                print(f"{args.check}: OK ({len(check.regions)} region(s): {', '.join(check.regions)})"
                      + (f", {len(check.warnings)} warning(s)" if check.warnings else ""))
            else:
                print(f"{args.check}: {len(check.errors)} error(s)", file=sys.stderr)
        return 2 if check.errors else 0
    print(describe_options())
    return 0


def _cmd_eventstore_build_map(args) -> int:
    """``photon eventstore build-map``: build each region's log-file map with Spark (see _buildmap)."""
    from dataclasses import asdict
    from photon.app._buildmap import build_map
    from photon.app._spark import spark_error
    config = load_config(args.config)
    regions = [config.region(args.region).name] if args.region else [r.name for r in config.pipeline_regions]
    for region in regions:
        try:
            result = build_map(config, region, range_mb=args.range_mb, show_progress=False if args.json else None)
        except Exception as e:  # a Spark failure: one readable line, exit 1
            print(f"photon eventstore build-map: region {region}: {spark_error(e, args.verbose)}", file=sys.stderr)
            return 1
        print(json.dumps(asdict(result), sort_keys=True) if args.json else
              f"region {result.region}: {result.entries} map entries from {result.files} files "
              f"({result.primary_bytes / 2**20:.1f} MB, {result.ranges} ranges) in {result.seconds:.1f} s -> "
              f"{result.out_dir}", flush=True)
    return 0


EXIT_DUPLICATE = 1
EXIT_UNREADABLE = 5


def _spark_job(args, label: str, job, input_bytes=None):
    """Run ``job(config, spark)`` with the config's Spark session (``input_bytes(config)``: the job's input
    size, when known before Spark starts); bad input, an unavailable registry or a Spark failure is one line
    on stderr (the Java stack only with --verbose) and exit code 5."""
    from photon.app._spark import spark_error, spark_session
    from photon.app._verify import VerifyInputError
    config = load_config(args.config)
    if label in ("verify", "recover"):
        _results_folder(args.out, config)
    try:
        size = input_bytes(config) if input_bytes is not None else None
        spark = spark_session(config, f"photon-{label}", verbose=args.verbose, input_bytes=size)
        return job(config, spark)
    except (VerifyInputError, idregistry.RegistryUnavailable) as e:
        print(f"photon {label}: {e}", file=sys.stderr)
    except Exception as e:             # a Spark (Java) failure, shown as one readable line
        if type(e).__module__.startswith(("pyspark", "py4j")):
            print(f"photon {label}: Spark failed: {spark_error(e, args.verbose)}", file=sys.stderr)
        else:
            raise
    return EXIT_UNREADABLE


def _results_folder(out, config) -> None:
    """Make verify's results folder (``--out``, else ``[verify].out_dir``) before the job starts, or name it
    as a configuration error (exit 2): a file in its place made the job fail with a traceback after its
    Spark scan."""
    folder = Path(out) if out else config.verify_dir
    why = folder_unmade(folder)
    if why is not None:
        what = "--out" if out else "[verify].out_dir (default <first region state_dir>/verify)"
        raise ConfigError(f"{what} {folder}: {why}")


def _verify_times(args):
    from photon.app._verify import parse_time
    try:
        return (parse_time(args.since) if args.since else None, parse_time(args.until) if args.until else None)
    except ValueError as e:
        raise ConfigError(f"--since/--until: {e}") from None


def _registry_for(config, job: str, needed: bool = True):
    """The registry for a batch job: the running one, or brought up from its data for the job's duration
    when none answers (see photon.app._jobregistry); nothing when the job does not need it."""
    from contextlib import nullcontext
    from photon.app._jobregistry import registry_for_job
    return registry_for_job(config, job) if needed else nullcontext()


def _cmd_verify(args) -> int:
    from photon.app._verify import format_report, input_bytes, run_verify
    since, until = _verify_times(args)

    def job(config, spark):
        show = not args.json and sys.stderr.isatty()
        with _registry_for(config, "photon verify", needed=args.export is None):
            report = run_verify(config, spark, since_us=since, until_us=until, export_dir=args.export,
                                out_dir=args.out, show_progress=show)
        print(json.dumps(report.as_dict()) if args.json else format_report(report), flush=True)
        if report.duplicates:
            names = ", ".join(f"{i} ({n} times)" for i, n in report.duplicate_ids)
            print(f"photon verify: {report.duplicates} click(s) joined more than once: {names}", file=sys.stderr)
            return EXIT_DUPLICATE
        return 0
    return _spark_job(args, "verify", job, input_bytes)


def _check_recoverable(path: str) -> None:
    """``photon recover --from PATH``: the recoverable Parquet an earlier verify wrote, checked before the
    registry or Spark starts. A path that does not exist, a folder with no Parquet in it (verify always writes
    one file, empty or not) or a file that is not such Parquet is a :class:`ConfigError` naming it (exit 2),
    never a traceback, nor a run that finds "0 recoverable" in the wrong folder."""
    import pyarrow
    from photon.app._verify import read_recoverable
    where = "the recoverable folder an earlier `photon verify` wrote, [verify].out_dir/recoverable"
    p = Path(path)
    if not p.exists():
        raise ConfigError(f"--from {path} does not exist ({where})")
    if p.is_dir() and not any(p.glob("*.parquet")):
        raise ConfigError(f"--from {path} holds no .parquet file ({where})")
    try:
        rows = read_recoverable(p)
    except (OSError, pyarrow.ArrowException) as e:
        raise ConfigError(f"--from {path} cannot be read as {where}: {e}") from None
    missing = {"id", "token", "raw"} - set(rows[0]) if rows else set()
    if missing:
        raise ConfigError(f"--from {path} lacks the column(s) {sorted(missing)} of {where}")


def _cmd_recover(args) -> int:
    from photon.app._recover import run_recover
    from photon.app._verify import format_report, run_verify

    if args.from_dir is not None:
        _check_recoverable(args.from_dir)

    def job(config, spark):
        with _registry_for(config, "photon recover"):
            return recover(config, spark)

    def recover(config, spark):
        path = args.from_dir
        if path is None:
            report = run_verify(config, spark, out_dir=args.out, show_progress=not args.json and sys.stderr.isatty())
            if not args.json:
                print(format_report(report), flush=True)
            if report.duplicates:
                print(f"photon recover: the output holds {report.duplicates} duplicate(s); recovering nothing",
                      file=sys.stderr)
                return EXIT_DUPLICATE
            path = report.recoverable_path
        done = run_recover(config, path, dry_run=args.dry_run)
        if args.json:
            print(json.dumps(done.as_dict()), flush=True)
        else:
            verb = "would delete and re-inject" if done.dry_run else "re-injected"
            print(f"recover: {done.candidates} recoverable, {done.joiner_alive} left alone (joiner running), "
                  f"{done.deleted} deleted from the registry, {done.token_changed} not (token changed), "
                  f"{verb} {done.reinjected if not done.dry_run else done.candidates - done.joiner_alive} "
                  f"event(s); {done.resumed} from an interrupted run", flush=True)
            for f in done.files:
                print(f"  wrote {f}")
        return 0
    return _spark_job(args, "recover", job)


ENV_CONFIG = "PHOTON_CONFIG"
"""The config file every command uses when ``--config`` is not given."""

EXAMPLES = {
    "gen": "photon gen --out /tmp/w --queries 10000 --regions a,b --json",
    "run": "photon run --config /etc/photon/photon.toml --region a     # one region, as its systemd unit does",
    "demo": "photon demo --dir /tmp/demo --queries 20000",
    "sql": "photon sql --config photon.toml \"SELECT region, count(*) FROM joined GROUP BY region\"",
    "compact": "photon compact --config photon.toml --json",
    "status": "photon status --config photon.toml --json || echo 'not every process is SERVING'",
    "region": "photon region down b --hard --config photon.toml && photon region up b --config photon.toml",
    "certs": "photon certs --out /etc/photon/tls --hosts 10.0.0.1,10.0.0.2,10.0.0.3",
    "config": "photon config --check photon.toml",
    "eventstore": "photon eventstore build-map --config photon.toml --region a",
    "verify": "photon verify --config photon.toml --since 2025-11-21T00:00:00Z --json",
    "recover": "photon recover --config photon.toml --dry-run",
    "registry": "photon registry status --config photon.toml --json",
}
"""One example per command, shown at the end of its --help."""

REGISTRY_EXAMPLES = """examples:
  photon registry status --config photon.toml --json
  photon registry reshard --config photon.toml --shards 4
  photon registry export --config photon.toml --out /backup/registry-$(date +%F)
  photon registry clear-tokens --config photon.toml --regions a
(--config may be left out when PHOTON_CONFIG names the file)"""


def _number(kind, low, *, inclusive: bool = False, high=None):
    """An argparse type: a ``kind`` (int or float) above ``low`` (at or above with ``inclusive``) and at most
    ``high``, so an out-of-range option is a usage error naming it (exit 2), never a run on a nonsense value."""
    def parse(text: str):
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not {'an integer' if kind is int else 'a number'}") from None
        if value != value or (value < low if inclusive else value <= low) or (high is not None and value > high):
            bound = f"{'at least' if inclusive else 'more than'} {low}" + (f" and at most {high}" if high is not None else "")
            raise argparse.ArgumentTypeError(f"must be {bound}, got {text}")
        return value
    parse.__name__ = kind.__name__       # argparse names the type in its "invalid int value" message
    return parse


_POSITIVE = _number(float, 0)
_POSITIVE_INT = _number(int, 1, inclusive=True)
_FRACTION = _number(float, 0, inclusive=True, high=1)


def _region_names(text: str) -> str:
    """``photon gen --regions``: comma-separated region names, as a config's ``[[regions]].name`` takes them."""
    import re
    names = [n.strip() for n in text.split(",")]
    bad = [n for n in names if not re.fullmatch(r"[A-Za-z0-9_-]+", n)]
    if bad or not names:
        raise argparse.ArgumentTypeError(f"{text!r}: each region name must be letters, digits, - and _ "
                                         f"(comma-separated), got {bad}")
    if len(set(names)) != len(names):
        raise argparse.ArgumentTypeError(f"{text!r}: a region is named twice")
    return text


def _config_arg(parser) -> None:
    env = os.environ.get(ENV_CONFIG)
    parser.add_argument("--config", required=not env, default=env,
                        help=f"photon.toml of the deployment (default: ${ENV_CONFIG}" + (f", now {env})" if env else ")"))


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version
    try:
        return version("photon-joiner")
    except PackageNotFoundError:
        return "unknown (not installed)"


class _VersionAction(argparse.Action):
    """``--version``: the installed package's version, looked up only when asked (reading the package
    metadata costs every other command, ``photon run`` first, tens of milliseconds at start)."""

    def __init__(self, option_strings, dest=argparse.SUPPRESS, default=argparse.SUPPRESS, help=None):
        super().__init__(option_strings, dest=dest, default=default, nargs=0,
                         help=help or "show the program's version number and exit")

    def __call__(self, parser, namespace, values, option_string=None):
        print(f"photon {_version()}", flush=True)
        parser.exit()


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="photon", description="Photon: joining of log streams, at most once at every instant and "
                                "exactly once after the verification and recovery jobs",
                                epilog=f"every command's --help ends with an example; --config defaults to ${ENV_CONFIG}")
    p.add_argument("--version", action=_VersionAction)
    sub = p.add_subparsers(dest="command", required=True)

    g = sub.add_parser("gen", help="write a generated workload, its photon.toml and its truth files")
    g.add_argument("--out", required=True, help="folder to write into")
    g.add_argument("--queries", type=_POSITIVE_INT, default=200_000)
    g.add_argument("--clicks-per-query", type=_number(float, 0, inclusive=True), default=0.1)
    g.add_argument("--regions", type=_region_names, default="a", help="comma-separated region names (each gets a full copy)")
    g.add_argument("--writers", type=_POSITIVE_INT, default=3, help="writer processes per stream")
    g.add_argument("--rotate-lines", type=_POSITIVE_INT, default=20_000, help="lines per log file before rotating")
    g.add_argument("--unjoinable", type=_FRACTION, default=0.02, help="fraction of clicks whose query never exists")
    g.add_argument("--duplicates", type=_FRACTION, default=0.01, help="fraction of clicks logged twice")
    g.add_argument("--bad-lines", type=_FRACTION, default=0.001, help="fraction of corrupt lines")
    g.add_argument("--unjoinable-after-s", type=_POSITIVE, default=5.0, help="written to the config's [join]")
    g.add_argument("--seed", type=int, default=7)
    g.add_argument("--ids", choices=ID_STYLES, default="photon",
                   help="photon: Photon ids (time inside); uuid: UUID ids with an RFC 3339 time field "
                        "(query_time, click_time), configured as [join].*_time_field")
    g.add_argument("--json", action="store_true", help="print what was written as one JSON object")
    g.set_defaults(fn=_cmd_gen)

    r = sub.add_parser("run", help="run the pipeline of a config")
    _config_arg(r)
    r.add_argument("--until-caught-up", action="store_true",
                   help="exit once every complete line is consumed and every event resolved, after "
                        "reconciling the registry with the output: 0, or 5 if clicks were lost in this run "
                        "(registered by this run's joiners and in no output)")
    r.add_argument("--timeout", type=_POSITIVE, default=None, help="give up after this many seconds (exit 3)")
    r.add_argument("--region", action="append", default=None, metavar="NAME",
                   help="run only this region's processes and registry replicas, reaching the other regions' "
                        "replicas at their configured addresses (repeatable; needs fixed registry ports: "
                        "[[regions]].port_base)")
    r.add_argument("--regions", default=None, help="the same for several regions at once (comma-separated)")
    r.add_argument("--json", action="store_true", help="also print the summary as one JSON line")
    r.add_argument("--compact", action="store_true",
                   help="also run `photon compact` every [compact].every_s seconds (off by default)")
    r.set_defaults(fn=_cmd_run)

    d = sub.add_parser("demo", help="generate a two-region workload and join it end to end")
    d.add_argument("--dir", default="demo")
    d.add_argument("--no-outage", action="store_true", help="do not take region b down mid-run")
    d.add_argument("--queries", type=_POSITIVE_INT, default=100_000)
    d.add_argument("--timeout", type=_POSITIVE, default=600)
    d.add_argument("--json", action="store_true")
    d.add_argument("--no-sql", action="store_true", help="skip the closing Spark SQL query")
    d.set_defaults(fn=_cmd_demo)

    q = sub.add_parser("sql", help="Spark SQL over the joined output, the input streams, unjoinable and "
                                   "quarantine (no query: an interactive prompt)")
    q.add_argument("query", nargs="?", default=None, help="one SQL statement (tables: joined, unjoinable, "
                                                         "quarantine and one per input stream)")
    _config_arg(q)
    q.add_argument("--format", choices=["table", "csv", "json"], default="table")
    q.add_argument("--out", default=None, help="write the result to this file instead of standard output")
    q.add_argument("--verbose", action="store_true", help="Spark's warnings and Java stacks too")
    q.add_argument("--infer-schemas", action="store_true", help="without [sql] schemas: sample the streams again "
                                                                "instead of using the cached inferred schemas")
    q.set_defaults(fn=_cmd_sql)

    k = sub.add_parser("compact", help="rewrite closed output partitions as Parquet and swap them in")
    _config_arg(k)
    k.add_argument("--regions", default=None, help="only these regions (comma-separated)")
    k.add_argument("--verbose", action="store_true")
    k.add_argument("--json", action="store_true", help="print the figures as one JSON object")
    k.set_defaults(fn=_cmd_compact)

    s = sub.add_parser("status", help="every process of the config, reached over the network from any machine: "
                                      "exit 0 only when all answer SERVING")
    s.add_argument("--json", action="store_true", help="print the status as one JSON object")
    s.add_argument("--interval", type=_number(float, 0, inclusive=True), default=1.0,
                   help="seconds between the two samples the rates come from (0: one sample, no rates)")
    s.add_argument("--timeout", type=_POSITIVE, default=1.0, help="seconds to wait for each process to answer")
    s.add_argument("--region", default=None, metavar="NAMES",
                   help="judge (exit code, problems) only these regions' processes (comma-separated): a "
                        "per-region probe")
    _config_arg(s)
    s.add_argument("--watch", action="store_true", help="refresh in place until Ctrl-C")
    s.add_argument("--every", type=_POSITIVE, default=2.0, help="seconds between refreshes with --watch")
    s.set_defaults(fn=_cmd_status)

    rg = sub.add_parser("region", help="take a region of a running deployment down, or bring it back")
    rg.add_argument("action", choices=["down", "up"])
    rg.add_argument("name", help="the region")
    _config_arg(rg)
    rg.add_argument("--hard", action="store_true", help="with down: SIGKILL every process of the region at once")
    rg.add_argument("--wait", type=_POSITIVE, default=60.0, help="seconds to wait for the region's launcher to act")
    rg.add_argument("--json", action="store_true", help="print the launcher's answer as one JSON object")
    rg.set_defaults(fn=_cmd_region)

    ce = sub.add_parser("certs", help="make a test CA, a certificate for every process and a Raft secret")
    ce.add_argument("--out", required=True, help="folder to write ca.pem, photon.pem, photon.key, raft.secret into")
    ce.add_argument("--server-name", default="photon", help="the name clients check servers' certificates for")
    ce.add_argument("--hosts", default="127.0.0.1,localhost", help="addresses also named in the certificate")
    ce.set_defaults(fn=_cmd_certs)

    c = sub.add_parser("config", help="list every option with its default, or --check a config file")
    c.add_argument("--check", metavar="FILE", nargs="?", const="", default=None,
                   help=f"report every error of FILE (default ${ENV_CONFIG}) at once, then warnings: S3 buckets "
                        f"that cannot be reached, fixed ports already in use on this machine")
    c.add_argument("--offline", action="store_true", help="with --check: no S3 requests and no port probes")
    c.add_argument("--json", action="store_true", help="with --check: one JSON object")
    c.set_defaults(fn=_cmd_config)

    es = sub.add_parser("eventstore", help="event store commands (build-map)")
    es_sub = es.add_subparsers(dest="eventstore_command", required=True)
    bm = es_sub.add_parser("build-map", help="build the log-file map of the primary logs with Spark")
    _config_arg(bm)
    bm.add_argument("--region", default=None, help="only this region (default: every region)")
    bm.add_argument("--range-mb", type=_POSITIVE, default=64.0, help="bytes of primary log per Spark task")
    bm.add_argument("--json", action="store_true", help="print each region's result as one JSON line")
    bm.add_argument("--verbose", action="store_true", help="Spark's warnings and full error stacks")
    bm.set_defaults(fn=_cmd_eventstore_build_map)

    v = sub.add_parser("verify", help="Spark job: duplicates, lost, recoverable, pending and unjoinable clicks")
    _config_arg(v)
    v.add_argument("--since", default=None, help="only ids timestamped at or after T (epoch s, epoch us or ISO 8601)")
    v.add_argument("--until", default=None, help="only ids timestamped before T")
    v.add_argument("--json", action="store_true", help="print one JSON object (and no progress)")
    v.add_argument("--export", default=None, help="use this registry export folder instead of taking one")
    v.add_argument("--out", default=None, help="folder for the results (default [verify].out_dir)")
    v.add_argument("--verbose", action="store_true", help="Spark warnings and Java stacks")
    v.set_defaults(fn=_cmd_verify)

    rc = sub.add_parser("recover", help="delete lost clicks from the registry (token must match) and re-inject them")
    _config_arg(rc)
    rc.add_argument("--dry-run", action="store_true", help="say what would be done, change nothing")
    rc.add_argument("--from", dest="from_dir", default=None,
                    help="the recoverable Parquet of an earlier verify (default: run verify now)")
    rc.add_argument("--out", default=None, help="folder for verify's results (default [verify].out_dir)")
    rc.add_argument("--json", action="store_true", help="print one JSON object")
    rc.add_argument("--verbose", action="store_true", help="Spark warnings and Java stacks")
    rc.set_defaults(fn=_cmd_recover)

    reg = sub.add_parser("registry", help="IdRegistry commands (status, reshard)", add_help=False)
    reg.add_argument("rest", nargs=argparse.REMAINDER)
    reg.set_defaults(fn=lambda a: _registry_command(a.rest))
    for name, parser in sub.choices.items():
        parser.formatter_class = argparse.RawDescriptionHelpFormatter
        parser.epilog = f"example:\n  {EXAMPLES[name]}"
    return p


def _registry_command(argv: list[str]) -> int:
    """``photon registry ...``; ``export`` brings the registry up for itself when none runs."""
    from photon.app._jobregistry import registry_for_job
    return idregistry.registry_command(argv, job_registry=registry_for_job)


def _registry_argv(argv: list[str]) -> list[str]:
    """``photon registry ...`` arguments with ``--config $PHOTON_CONFIG`` added when none is given."""
    env = os.environ.get(ENV_CONFIG)
    helping = any(a in ("-h", "--help") for a in argv)
    named = any(a in ("--config", "-c") or a.startswith("--config=") for a in argv)
    if env and argv and not helping and not named:
        return [*argv, "--config", env]
    return argv


def main(argv: list[str] | None = None) -> int:
    try:
        return _main(sys.argv[1:] if argv is None else argv)
    finally:
        from photon.app._forkserver import discard_early
        discard_early()                  # a fork server no launcher took (a config error, a held region)


def _main(argv: list[str]) -> int:
    if argv[:1] == ["registry"]:           # the registry room parses its own subcommands
        try:
            return _registry_command(_registry_argv(argv[1:]))
        except SystemExit as e:             # its --help (or a usage error): examples follow its own text
            if any(a in ("-h", "--help") for a in argv[1:]):
                print(REGISTRY_EXAMPLES)
            return e.code if isinstance(e.code, int) else 2
        except ConfigError as e:
            print(f"photon: configuration error: {e}", file=sys.stderr)
            return 2
    args = build_parser().parse_args(argv)
    try:
        return args.fn(args)
    except ConfigError as e:
        print(f"photon: configuration error: {e}", file=sys.stderr)
        return 2
    except AlreadyRunning as e:
        print(f"photon: {e}", file=sys.stderr)
        return 4
    except KeyboardInterrupt:
        print(f"photon {args.command}: interrupted", file=sys.stderr, flush=True)
        return 130


if __name__ == "__main__":
    sys.exit(main())
