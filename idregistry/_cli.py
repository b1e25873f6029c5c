"""``photon registry <command>``: ``status`` (every replica of every shard) and ``reshard``."""
from __future__ import annotations

import argparse
import json
import sys

from photon import ConfigError, load_config
from idregistry._client import RegistryClient, RegistryUnavailable
from idregistry._layout import registry_endpoints


def _status(args) -> int:
    config = load_config(args.config)
    client = RegistryClient(registry_endpoints(config), retry_timeout_s=args.timeout)
    try:
        rows = client.status()
    except RegistryUnavailable as e:
        print(f"registry unavailable: {e}", file=sys.stderr)
        return 1
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


def registry_command(argv: list[str]) -> int:
    """Run ``photon registry <argv>``; returns the process exit code."""
    parser = argparse.ArgumentParser(prog="photon registry", description="IdRegistry commands")
    sub = parser.add_subparsers(dest="command", required=True)
    st = sub.add_parser("status", help="every replica of every shard: leader, term, commit index, ids held")
    st.add_argument("--config", "-c", required=True, help="photon.toml")
    st.add_argument("--json", action="store_true", help="print the raw status dicts as JSON")
    st.add_argument("--timeout", type=float, default=5.0, help="seconds to wait for the registry")
    st.set_defaults(fn=_status)
    args = parser.parse_args(argv)
    try:
        return args.fn(args)
    except ConfigError as e:
        print(str(e), file=sys.stderr)
        return 2
