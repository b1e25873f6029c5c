"""The README's plot of visible join latency against the round trip between regions, from ``bench.regions``.

    python -m bench.regions --rtts 0,30,100 ... --json > after.txt
    python -m bench.regions_plot after.txt [--before before.txt] [--out docs/img/regions-latency-vs-rtt.png]

Reads the JSON object on the last line of each file (``rtt<R>ms_join_p50_ms``, ``_p90``, ``_p99``) and draws
p50/p90/p99 against the round trip (solid: the run given; dashed: ``--before``), with the target line
(the 0 ms p50 plus the round trip plus 50 ms). Needs matplotlib (the ``bench`` extra of pyproject.toml).
"""
from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path


def figures_of(path: str) -> dict:
    """The last JSON object line of a ``bench.regions --json`` output."""
    for line in reversed(Path(path).read_text().splitlines()):
        if line.startswith("{"):
            return json.loads(line)
    raise ValueError(f"{path}: no JSON line (run bench.regions with --json)")


def series(figures: dict) -> tuple[list[float], dict[str, list[float]]]:
    """The round trips measured and, per percentile, the visible join latency at each."""
    rtts = sorted({float(m.group(1)) for k in figures if (m := re.fullmatch(r"rtt([\d.]+)ms_join_p50_ms", k))})
    return rtts, {p: [figures[f"rtt{r:g}ms_join_{p}_ms"] for r in rtts] for p in ("p50", "p90", "p99")}


def plot(after: dict, before: dict | None, out: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(6.4, 4.0), dpi=120)
    colors = {"p50": "#2b6cb0", "p90": "#dd6b20", "p99": "#9b2c2c"}
    rtts, lat = series(after)
    for p, ys in lat.items():
        ax.plot(rtts, ys, marker="o", color=colors[p], label=f"{p}")
    if before:
        b_rtts, b_lat = series(before)
        for p, ys in b_lat.items():
            ax.plot(b_rtts, ys, marker="x", linestyle="--", color=colors[p], alpha=0.5, label=f"{p} before")
    if 0.0 in rtts:
        base = lat["p50"][rtts.index(0.0)]
        ax.plot(rtts, [base + r + 50 for r in rtts], color="#718096", linestyle=":",
                label="target: 0 ms p50 + RTT + 50 ms")
    ax.set_xlabel("round trip between regions (ms)")
    ax.set_ylabel("click to joined line visible (ms)")
    ax.set_title("Two regions, bench.regions: union's visible join latency")
    ax.set_xticks(rtts)
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8, ncol=2)
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out)
    plt.close(fig)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.regions_plot", description=__doc__.splitlines()[0])
    p.add_argument("after", help="bench.regions --json output")
    p.add_argument("--before", help="an earlier run's output, drawn dashed")
    p.add_argument("--out", default="docs/img/regions-latency-vs-rtt.png")
    args = p.parse_args(argv)
    plot(figures_of(args.after), figures_of(args.before) if args.before else None, Path(args.out))
    print(args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
