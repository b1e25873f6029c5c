"""The ``photon`` command line: gen, run, demo, sql, compact, status, config, registry.

It lives in the launcher layer (:mod:`photon.app`), above every room, and imports them directly."""
from __future__ import annotations

import argparse
import json
import shutil
import signal
import sys
import time
from pathlib import Path

import orjson

import idregistry
import joiner
from photon import ConfigError, describe_options, load_config, read_output_lines
from photon.app._gen import GenOptions, generate
from photon.app._launcher import AlreadyRunning, Launcher, RunOptions, launcher_state_file
from photon.app._summary import build_summary, dumps, format_summary


def _cmd_gen(args) -> int:
    regions = tuple(r.strip() for r in args.regions.split(",") if r.strip())
    opts = GenOptions(out=args.out, queries=args.queries, clicks_per_query=args.clicks_per_query,
                      regions=regions, writers=args.writers, rotate_lines=args.rotate_lines,
                      unjoinable_fraction=args.unjoinable, duplicate_fraction=args.duplicates,
                      bad_line_fraction=args.bad_lines, seed=args.seed, unjoinable_after_s=args.unjoinable_after_s)
    t0 = time.monotonic()
    s = generate(opts)
    print(f"wrote {s.queries} queries and {s.clicks_lines} click lines ({s.joinable_clicks} joinable, "
          f"{s.unjoinable_clicks} unjoinable, {s.duplicate_click_lines} duplicated lines, "
          f"{s.bad_query_lines + s.bad_click_lines} bad lines) for region(s) {', '.join(s.regions)} "
          f"in {time.monotonic() - t0:.1f} s")
    print(f"config: {s.config}")
    print(f"truth:  {Path(args.out).resolve() / 'truth'}")
    return 0


def _run(config, until_caught_up: bool, timeout_s, as_json: bool, regions=None,
         compact: bool = False) -> tuple[int, dict]:
    opts = RunOptions(until_caught_up=until_caught_up, timeout_s=timeout_s, regions=regions, compact=compact)

    def on_signal(signum, _frame):
        opts.stop_requested.append(signum)

    signal.signal(signal.SIGINT, on_signal)
    signal.signal(signal.SIGTERM, on_signal)
    launcher = Launcher(config, opts)
    code = launcher.run()
    summary = build_summary(config, time.monotonic() - launcher.started_at, regions)
    summary["exit_code"] = code
    print(format_summary(summary), flush=True)
    if as_json:
        print(dumps(summary), flush=True)
    return code, summary


def _cmd_run(args) -> int:
    config = load_config(args.config)
    regions = args.regions.split(",") if args.regions else None
    if regions:
        for r in regions:
            config.region(r)
    return _run(config, args.until_caught_up, args.timeout, args.json, regions, args.compact)[0]


def _cmd_demo(args) -> int:
    out = Path(args.dir).resolve()
    print(f"photon demo: generating {args.queries} queries (~{int(args.queries * 0.1)} clicks) for regions "
          f"a and b under {out}", flush=True)
    s = generate(GenOptions(out=str(out), queries=args.queries, regions=("a", "b"), unjoinable_after_s=5.0))
    for sub in ("out", "state"):
        shutil.rmtree(out / sub, ignore_errors=True)
    config = load_config(s.config)
    print(f"photon demo: joining both regions' copies through one shared IdRegistry "
          f"(expect {s.joinable_clicks} joined once in all, {s.unjoinable_clicks} unjoinable)", flush=True)
    code, summary = _run(config, True, args.timeout, False)
    ids = [orjson.loads(line)[config.join.foreign_id_field]
           for region in config.regions for line in read_output_lines(region.joined_dir)]
    joined = set(ids)
    dups = len(ids) - len(joined)
    truth = set((out / "truth" / "joinable.txt").read_text().split())
    print(f"photon demo: {len(joined & truth)}/{len(truth)} joinable clicks in the output, "
          f"{dups} duplicates, {len(joined - truth)} unexpected")
    if not args.no_sql:
        _demo_query(config)
    if args.json:
        summary["demo"] = {"joinable": len(truth), "joined": len(joined & truth), "duplicates": dups,
                           "unexpected": len(joined - truth)}
        print(json.dumps(summary, sort_keys=True), flush=True)
    return code if not dups and joined == truth else (code or 1)


def _cmd_sql(args) -> int:
    from photon.app._sql import sql_command
    config = load_config(args.config)
    return sql_command(config, args.query, args.format, args.out, args.verbose)


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
    config = load_config(args.config)
    path = launcher_state_file(config)
    if path.exists():
        state = json.loads(path.read_text())
        print(f"launcher pid {state['launcher_pid']}")
        for name, p in state["processes"].items():
            print(f"  {name:<20} pid {p['pid']!s:<8} restarts {p['restarts']}")
    print(format_summary(build_summary(config, 0.0)))
    for region in config.regions:
        for name, j in sorted(joiner.read_status(region.state_dir).items()):
            print(f"  joiner {name:<10} requests {j.get('requests', 0):>7}  joined {j.get('joined', 0):>8}  "
                  f"already {j.get('already_joined', 0):>6}  not found {j.get('not_found', 0):>6}  "
                  f"throttled {j.get('throttled', 0):>5}  registry errors {j.get('registry_errors', 0)}  "
                  f"in flight {j.get('in_flight', 0)}")
    return 0


def _cmd_config(args) -> int:
    if args.check:
        cfg = load_config(args.check)
        print(f"{args.check}: OK ({len(cfg.regions)} region(s): {', '.join(r.name for r in cfg.regions)})")
        return 0
    print(describe_options())
    return 0


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="photon", description="Photon: exactly-once joining of log streams")
    sub = p.add_subparsers(dest="command", required=True)

    g = sub.add_parser("gen", help="write a generated workload, its photon.toml and its truth files")
    g.add_argument("--out", required=True, help="folder to write into")
    g.add_argument("--queries", type=int, default=200_000)
    g.add_argument("--clicks-per-query", type=float, default=0.1)
    g.add_argument("--regions", default="a", help="comma-separated region names (each gets a full copy)")
    g.add_argument("--writers", type=int, default=3, help="writer processes per stream")
    g.add_argument("--rotate-lines", type=int, default=20_000, help="lines per log file before rotating")
    g.add_argument("--unjoinable", type=float, default=0.02, help="fraction of clicks whose query never exists")
    g.add_argument("--duplicates", type=float, default=0.01, help="fraction of clicks logged twice")
    g.add_argument("--bad-lines", type=float, default=0.001, help="fraction of corrupt lines")
    g.add_argument("--unjoinable-after-s", type=float, default=5.0, help="written to the config's [join]")
    g.add_argument("--seed", type=int, default=7)
    g.set_defaults(fn=_cmd_gen)

    r = sub.add_parser("run", help="run the pipeline of a config")
    r.add_argument("--config", required=True)
    r.add_argument("--until-caught-up", action="store_true",
                   help="exit 0 once every complete line is consumed and every event resolved")
    r.add_argument("--timeout", type=float, default=None, help="give up after this many seconds (exit 3)")
    r.add_argument("--regions", default=None, help="run only these regions' services (comma-separated)")
    r.add_argument("--json", action="store_true", help="also print the summary as one JSON line")
    r.add_argument("--compact", action="store_true",
                   help="also run `photon compact` every [compact].every_s seconds (off by default)")
    r.set_defaults(fn=_cmd_run)

    d = sub.add_parser("demo", help="generate a two-region workload and join it end to end")
    d.add_argument("--dir", default="demo")
    d.add_argument("--queries", type=int, default=100_000)
    d.add_argument("--timeout", type=float, default=600)
    d.add_argument("--json", action="store_true")
    d.add_argument("--no-sql", action="store_true", help="skip the closing Spark SQL query")
    d.set_defaults(fn=_cmd_demo)

    q = sub.add_parser("sql", help="Spark SQL over the joined output, the input streams, unjoinable and "
                                   "quarantine (no query: an interactive prompt)")
    q.add_argument("query", nargs="?", default=None, help="one SQL statement (tables: joined, unjoinable, "
                                                         "quarantine and one per input stream)")
    q.add_argument("--config", required=True)
    q.add_argument("--format", choices=["table", "csv", "json"], default="table")
    q.add_argument("--out", default=None, help="write the result to this file instead of standard output")
    q.add_argument("--verbose", action="store_true", help="Spark's warnings and Java stacks too")
    q.set_defaults(fn=_cmd_sql)

    k = sub.add_parser("compact", help="rewrite closed output partitions as Parquet and swap them in")
    k.add_argument("--config", required=True)
    k.add_argument("--regions", default=None, help="only these regions (comma-separated)")
    k.add_argument("--verbose", action="store_true")
    k.set_defaults(fn=_cmd_compact)

    s = sub.add_parser("status", help="processes and counters of a (running or finished) pipeline")
    s.add_argument("--config", required=True)
    s.set_defaults(fn=_cmd_status)

    c = sub.add_parser("config", help="list every option with its default, or --check a config file")
    c.add_argument("--check", metavar="FILE")
    c.set_defaults(fn=_cmd_config)

    reg = sub.add_parser("registry", help="IdRegistry commands (status, reshard)", add_help=False)
    reg.add_argument("rest", nargs=argparse.REMAINDER)
    reg.set_defaults(fn=lambda a: idregistry.registry_command(a.rest))
    return p


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["registry"]:           # the registry room parses its own subcommands
        try:
            return idregistry.registry_command(argv[1:])
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
        return 130


if __name__ == "__main__":
    sys.exit(main())
