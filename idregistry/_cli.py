"""``photon registry <command>``: ``status`` (every replica of every shard), ``reshard``, ``export`` (every
shard as Parquet; when no replica answers, the ``photon`` command brings the registry up from its data for
the export, see :mod:`photon.app._jobregistry`) and ``clear-tokens`` (drop the tokens of ids found in the
output)."""
from __future__ import annotations

import argparse
import json
import sys
import time
from contextlib import nullcontext

from photon import ConfigError, PhotonConfig, SystemClock, load_config, use_tls, wait_until
from idregistry._client import RegistryClient, RegistryUnavailable
from idregistry._export import clear_output_tokens, export_registry
from idregistry._layout import read_layout, registry_endpoints


def _load(args) -> PhotonConfig:
    """The deployment's config, with this process's TLS set as it says (every command connects)."""
    config = load_config(args.config)
    use_tls(config)
    return config


def _client(config: PhotonConfig, timeout_s: float) -> RegistryClient:
    return RegistryClient(registry_endpoints(config), retry_timeout_s=timeout_s)


def _status(args) -> int:
    client = _client(_load(args), args.timeout)
    try:
        rows = client.status()
    finally:
        client.close()
    if args.json:
        print(json.dumps(rows, indent=1))
        return 0
    print(f"{'shard':>5} {'rep':>3} {'address':<21} {'pid':>7} {'role':<8} {'term':>5} {'commit':>8} "
          f"{'ids held':>10} {'queue':>5} {'ids/s':>9} gc boundary")
    for r in rows:
        if "error" in r:
            print(f"{r['shard']:>5} {r['replica']:>3} {r['address']:<21} {'-':>7} DOWN     {r['error']}")
            continue
        role = "leader" if r["is_leader"] else "follower"
        print(f"{r['shard']:>5} {r['replica']:>3} {r['address']:<21} {r['pid']:>7} {role:<8} {r['term']:>5} "
              f"{r['commit_index']:>8} {r['ids_held']:>10} {r['queue_depth']:>5} {r['ids_per_s']:>9} "
              f"{r['gc_boundary_us']}")
    return 0


def _reshard(args) -> int:
    config = _load(args)
    skew = config.registry.max_clock_skew_s
    effective_in = args.effective_in if args.effective_in is not None else 2 * skew
    if args.shards < 1:
        print(f"--shards must be >= 1, got {args.shards}", file=sys.stderr)
        return 2
    if effective_in <= skew:
        print(f"--effective-in must be more than the clock-skew bound max_clock_skew_s = {skew} s "
              f"(ids up to now + {skew} s may already exist), got {effective_in}", file=sys.stderr)
        return 2
    layout, addresses = read_layout(config, grow_to=args.shards)   # the launcher starts new shards' replicas
    endpoints = {shard: [t[1] for t in triples] for shard, triples in addresses.items()}
    client = _client(config, args.wait)
    try:
        def leaders_up() -> bool:
            for shard in range(args.shards):
                rows = [client.replica_status(a) for a in endpoints[shard]]
                if not any(r.get("is_leader") for r in rows):
                    return False
            return True
        try:
            wait_until(leaders_up, args.wait, interval=0.2, message="a leader in every shard")
        except TimeoutError:
            print(f"not every shard of {args.shards} has a leader after {args.wait} s: new shards' replicas are "
                  f"started by the launcher (`photon run`); is it running?", file=sys.stderr)
            return 1
        start_us = SystemClock().now_us() + int(effective_in * 1e6)
        try:
            sharding = client.reshard(start_us, args.shards, endpoints)
        except ValueError as e:
            print(str(e), file=sys.stderr)
            return 1
        print(f"from {start_us} us (in {effective_in:g} s, at {time.strftime('%H:%M:%S', time.gmtime(start_us / 1e6))} "
              f"UTC) ids map to {args.shards} shards; sharding config v{sharding.version}: "
              f"{json.dumps(sharding.as_dict()['epochs'])}")
        return 0
    finally:
        client.close()


def _export(args, job_registry=None) -> int:
    config = _load(args)
    with job_registry(config, "photon registry export") if job_registry else nullcontext():
        client = _client(config, args.timeout)
        try:
            manifest = export_registry(client, args.out, on_shard=lambda s, n: print(
                f"shard {s}: {n} ids", file=sys.stderr, flush=True))
        except OSError as e:
            print(f"cannot write the export to {args.out}: {e}", file=sys.stderr)
            return 1
        finally:
            client.close()
    total = sum(s["rows"] for s in manifest["shards"].values())
    print(f"exported {total} ids of {len(manifest['shards'])} shard(s) to {args.out}")
    return 0


def _clear_tokens(args) -> int:
    config = _load(args)
    client = _client(config, args.timeout)
    try:
        regions = [r.strip() for r in args.regions.split(",") if r.strip()] if args.regions else None
        for name in regions or ():
            config.region(name)                     # names an unknown region
        done = clear_output_tokens(config, client, regions)
        stats = client.statistics()
    finally:
        client.close()
    dropped = sum(s.tokens_dropped_ids for s in stats.shards)
    saved = sum(s.bytes_saved_by_clearing for s in stats.shards)
    held = sum(s.ids_held for s in stats.shards)
    print(f"cleared {done['cleared']} tokens of {done['ids']} output ids in {done['files']} new output file(s); "
          f"registry: {dropped} of {held} ids held without a token, {saved} bytes saved")
    return 0


def registry_command(argv: list[str], job_registry=None) -> int:
    """Run ``photon registry <argv>``; returns the process exit code. ``job_registry(config, job)``, when
    given, is a context manager ``export`` runs inside: the launcher layer's, which brings the registry up
    from its data for the export when no replica answers."""
    parser = argparse.ArgumentParser(prog="photon registry", description="IdRegistry commands")
    sub = parser.add_subparsers(dest="command", required=True)
    st = sub.add_parser("status", help="every replica of every shard: leader, term, commit index, ids held")
    st.add_argument("--config", "-c", required=True, help="photon.toml")
    st.add_argument("--json", action="store_true", help="print the raw status dicts as JSON")
    st.add_argument("--timeout", type=float, default=5.0, help="seconds to wait for the registry")
    st.set_defaults(fn=_status)
    rs = sub.add_parser("reshard", help="change the number of shards from a time later than now + the skew bound")
    rs.add_argument("--config", "-c", required=True, help="photon.toml")
    rs.add_argument("--shards", type=int, required=True, help="shard count of the new epoch")
    rs.add_argument("--effective-in", type=float, default=None,
                    help="seconds from now when the new count applies (default: twice max_clock_skew_s; must "
                         "be more than max_clock_skew_s)")
    rs.add_argument("--wait", type=float, default=60.0, help="seconds to wait for the new shards' leaders")
    rs.set_defaults(fn=_reshard)
    ex = sub.add_parser("export", help="write every shard's (id, token, timestamp_us, registered_us) as Parquet, shard by shard")
    ex.add_argument("--config", "-c", required=True, help="photon.toml")
    ex.add_argument("--out", required=True, help="folder to write shard-<s>.parquet and _export.json into")
    ex.add_argument("--timeout", type=float, default=30.0, help="seconds to wait for the registry")
    ex.set_defaults(fn=lambda a: _export(a, job_registry))
    ct = sub.add_parser("clear-tokens", help="clear the tokens of ids found in the joined output")
    ct.add_argument("--config", "-c", required=True, help="photon.toml")
    ct.add_argument("--timeout", type=float, default=30.0, help="seconds to wait for the registry")
    ct.add_argument("--regions", default=None, help="only the output of these regions (comma-separated)")
    ct.set_defaults(fn=_clear_tokens)
    args = parser.parse_args(argv)
    try:
        return args.fn(args)
    except ConfigError as e:
        print(str(e), file=sys.stderr)
        return 2
    except RegistryUnavailable as e:
        print(f"registry unavailable: {e}", file=sys.stderr)
        return 1
