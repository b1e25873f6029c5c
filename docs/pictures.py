"""Draws the pictures of the README and docs/deploy.md as SVG, from figures written down in README.md.

    python docs/pictures.py            # (re)writes docs/img/*.svg
    python docs/pictures.py --check    # exit 1 if a committed picture differs from what this draws

Plain SVG written by hand (no plotting library needed): the architecture of a three-region deployment,
join latency against the round trip between regions, and clicks joined per second.
"""
from __future__ import annotations

import sys
from pathlib import Path

OUT = Path(__file__).resolve().parent / "img"
FONT = 'font-family="Helvetica, Arial, sans-serif"'

# bench.regions, one full default run over the TUN relay (README, Regions): join latency to the first flush
RTT_MS = [0, 30, 100]
LATENCY_MS = {"p50": [36.6, 70.2, 166.1], "p90": [68.0, 93.3, 201.5], "p99": [108.1, 118.8, 255.6]}
# clicks joined per second (README, Benchmarks; the last two bars side by side from bench.compare, loaded machine)
THROUGHPUT = [
    ("one region, bench.pipeline backlog", 19_800, "#2b6cb0"),
    ("two regions at 0 ms, bench.regions backlog", 12_165, "#3182ce"),
    ("two regions at 30 ms", 7_461, "#4299e1"),
    ("two regions at 100 ms", 7_050, "#63b3ed"),
    ("Photon from a cold start, bench.compare (1M queries)", 6_336, "#2c5282"),
    ("Spark stream-stream join, same bench and files", 1_954, "#a0aec0"),
]


def _svg(width: int, height: int, body: list[str], title: str) -> str:
    return "\n".join([f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
                      f'viewBox="0 0 {width} {height}" {FONT} font-size="13">',
                      f"<title>{title}</title>", f'<rect width="{width}" height="{height}" fill="white"/>',
                      *body, "</svg>", ""])


def _text(x, y, s, size=13, anchor="start", weight="normal", fill="#1a202c") -> str:
    s = s.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
    return (f'<text x="{x:g}" y="{y:g}" font-size="{size}" text-anchor="{anchor}" font-weight="{weight}" '
            f'fill="{fill}">{s}</text>')


def _box(x, y, w, h, fill, stroke="#2d3748", rx=6) -> str:
    return f'<rect x="{x}" y="{y}" width="{w}" height="{h}" rx="{rx}" fill="{fill}" stroke="{stroke}"/>'


def _arrow(x1, y1, x2, y2, color="#2d3748", dash="") -> str:
    extra = f' stroke-dasharray="{dash}"' if dash else ""
    return (f'<line x1="{x1}" y1="{y1}" x2="{x2}" y2="{y2}" stroke="{color}" stroke-width="1.6"'
            f' marker-end="url(#arrow)"{extra}/>')


def architecture() -> str:
    body = ['<defs><marker id="arrow" viewBox="0 0 10 10" refX="9" refY="5" markerWidth="7" markerHeight="7" '
            'orient="auto-start-reverse"><path d="M 0 0 L 10 5 L 0 10 z" fill="#2d3748"/></marker></defs>',
            _text(480, 28, "A three-region Photon deployment (one config, one photon run --region per machine)",
                  16, "middle", "bold")]
    regions = [("a", 20, "machine a: 10.0.0.1, port_base 20000", True),
               ("b", 340, "machine b: 10.0.0.2, port_base 20000", True),
               ("c", 660, "machine c: 10.0.0.3, port_base 20000", False)]
    for name, x, where, pipeline in regions:
        body += [_box(x, 50, 280, 420, "#f7fafc"), _text(x + 140, 72, f"region {name}", 15, "middle", "bold"),
                 _text(x + 140, 90, where, 11, "middle", fill="#4a5568"),
                 _text(x + 140, 108, f"systemd: photon-region@{name} (launcher + control +3)", 11, "middle",
                       fill="#4a5568")]
        if pipeline:
            body += [_box(x + 20, 120, 240, 34, "#fefcbf"),
                     _text(x + 140, 142, f"logs: own copy of queries + clicks", 12, "middle"),
                     _box(x + 20, 180, 110, 40, "#c6f6d5"), _text(x + 75, 205, "dispatcher", 12, "middle"),
                     _box(x + 150, 180, 110, 40, "#bee3f8"), _text(x + 205, 200, "joiners", 12, "middle"),
                     _text(x + 205, 214, "+10 ..", 10, "middle", fill="#4a5568"),
                     _box(x + 150, 250, 110, 40, "#e9d8fd"), _text(x + 205, 270, "event store", 12, "middle"),
                     _text(x + 205, 284, "+500 / +600", 10, "middle", fill="#4a5568"),
                     _box(x + 20, 250, 110, 40, "#fed7d7"), _text(x + 75, 275, "joined output", 12, "middle"),
                     _arrow(x + 75, 154, x + 75, 178), _arrow(x + 130, 200, x + 148, 200),
                     _arrow(x + 205, 220, x + 205, 248), _arrow(x + 150, 214, x + 122, 248)]
        replicas = 2 if pipeline else 1
        for i in range(replicas):
            rx = x + 20 + i * 125
            body += [_box(rx, 330, 115, 44, "#feebc8"), _text(rx + 57, 350, "registry replica", 12, "middle"),
                     _text(rx + 57, 366, "+100 ..", 10, "middle", fill="#4a5568")]
        body += [_text(x + 140, 400, "metrics (Prometheus) and gRPC health", 11, "middle", fill="#4a5568"),
                 _text(x + 140, 416, "on every process, mutual TLS with [tls]", 11, "middle", fill="#4a5568"),
                 _text(x + 140, 444, f"state: /var/lib/photon/{name}  logs: .../{name}/logs", 11, "middle",
                       fill="#4a5568")]
    body += [f'<path d="M 160 374 C 160 420, 800 420, 717 374" fill="none" stroke="#c05621" stroke-width="1.6" '
             f'stroke-dasharray="5 3"/>',
             f'<path d="M 480 374 C 480 400, 560 400, 600 374" fill="none" stroke="#c05621" stroke-width="1.6" '
             f'stroke-dasharray="5 3"/>',
             _text(480, 492, "one Raft group per registry shard, 5 replicas 2/2/1: any one machine can be lost; "
                             "commits go to the leader, lookups to a near replica", 12, "middle", fill="#c05621"),
             _text(480, 512, "photon status / photon region down|up from any machine: gRPC health, metrics, "
                             "registry status RPC, each launcher's control endpoint", 12, "middle")]
    return _svg(960, 530, body, "Photon: three-region deployment")


def _axes(x0, y0, w, h, xmax, ymax, xticks, yticks, xlabel, ylabel) -> list[str]:
    out = [f'<line x1="{x0}" y1="{y0}" x2="{x0 + w}" y2="{y0}" stroke="#2d3748"/>',
           f'<line x1="{x0}" y1="{y0}" x2="{x0}" y2="{y0 - h}" stroke="#2d3748"/>']
    for t in xticks:
        x = x0 + w * t / xmax
        out += [f'<line x1="{x:g}" y1="{y0}" x2="{x:g}" y2="{y0 + 5}" stroke="#2d3748"/>',
                _text(x, y0 + 20, f"{t:g}", 12, "middle")]
    for t in yticks:
        y = y0 - h * t / ymax
        out += [f'<line x1="{x0 - 5}" y1="{y:g}" x2="{x0 + w}" y2="{y:g}" stroke="#e2e8f0"/>',
                _text(x0 - 8, y + 4, f"{t:g}", 12, "end")]
    out += [_text(x0 + w / 2, y0 + 42, xlabel, 13, "middle"),
            f'<text x="{x0 - 48}" y="{y0 - h / 2}" font-size="13" text-anchor="middle" '
            f'transform="rotate(-90 {x0 - 48} {y0 - h / 2})">{ylabel}</text>']
    return out


def latency_vs_rtt() -> str:
    x0, y0, w, h, xmax, ymax = 80, 330, 460, 260, 110, 300
    body = [_text(330, 28, "Join latency against the round trip between regions", 16, "middle", "bold"),
            _text(330, 48, "bench.regions: regions a, b and registry-only c in network namespaces, 1,000 clicks/s",
                  12, "middle", fill="#4a5568")]
    body += _axes(x0, y0, w, h, xmax, ymax, [0, 30, 60, 100], [0, 50, 100, 150, 200, 250, 300],
                  "round trip between regions (ms)", "latency (ms)")
    target = [(r, LATENCY_MS["p50"][0] + r + 50) for r in (0, 100)]
    pts = " ".join(f"{x0 + w * r / xmax:g},{y0 - h * v / ymax:g}" for r, v in target)
    body.append(f'<polyline points="{pts}" fill="none" stroke="#a0aec0" stroke-width="1.5" stroke-dasharray="6 4"/>')
    colors = {"p50": "#2b6cb0", "p90": "#38a169", "p99": "#c05621"}
    for q, values in LATENCY_MS.items():
        pts = [(x0 + w * r / xmax, y0 - h * v / ymax) for r, v in zip(RTT_MS, values)]
        body.append(f'<polyline points="{" ".join(f"{x:g},{y:g}" for x, y in pts)}" fill="none" '
                    f'stroke="{colors[q]}" stroke-width="2.2"/>')
        body += [f'<circle cx="{x:g}" cy="{y:g}" r="4" fill="{colors[q]}"/>' for x, y in pts]
        body += [_text(x + 6, y - 7, f"{v:g}", 11, fill=colors[q]) for (x, y), v in zip(pts, values)]
    ly = 80
    for q, c in colors.items():
        body += [f'<line x1="{x0 + 20}" y1="{ly}" x2="{x0 + 44}" y2="{ly}" stroke="{c}" stroke-width="2.2"/>',
                 _text(x0 + 50, ly + 4, f"join {q}", 12)]
        ly += 18
    body += [f'<line x1="{x0 + 20}" y1="{ly}" x2="{x0 + 44}" y2="{ly}" stroke="#a0aec0" stroke-dasharray="6 4"/>',
             _text(x0 + 50, ly + 4, "target: p50 at 0 ms + one round trip + 50 ms", 12),
             _text(330, 398, "latency from a click's line written in both copies to its joined line's first flush; "
                             "one full run, earlier definitions (README, Regions)", 11, "middle", fill="#4a5568")]
    return _svg(660, 410, body, "Join latency against round trip")


def throughput() -> str:
    x0, y0, bar_h, gap, w, xmax = 330, 70, 26, 14, 380, 25_000
    body = [_text(370, 28, "Clicks joined per second on this 2-core machine", 16, "middle", "bold"),
            _text(370, 48, "backlog drains (unpaced); the last two bars: bench.compare, one workload, "
                           "both from a cold start", 12, "middle", fill="#4a5568")]
    for i, (label, value, color) in enumerate(THROUGHPUT):
        y = y0 + i * (bar_h + gap)
        body += [_text(x0 - 10, y + 17, label, 12, "end"),
                 f'<rect x="{x0}" y="{y}" width="{w * value / xmax:g}" height="{bar_h}" fill="{color}"/>',
                 _text(x0 + w * value / xmax + 6, y + 17, f"{value:,}", 12)]
    axis_y = y0 + len(THROUGHPUT) * (bar_h + gap)
    body.append(f'<line x1="{x0}" y1="{axis_y}" x2="{x0 + w}" y2="{axis_y}" stroke="#2d3748"/>')
    for t in (0, 5_000, 10_000, 15_000, 20_000, 25_000):
        x = x0 + w * t / xmax
        body += [f'<line x1="{x:g}" y1="{axis_y}" x2="{x:g}" y2="{axis_y + 5}" stroke="#2d3748"/>',
                 _text(x, axis_y + 19, f"{t // 1000}K", 11, "middle")]
    body.append(_text(370, axis_y + 40, "clicks joined/s (README, Benchmarks; bench.compare on a loaded machine)", 12, "middle"))
    return _svg(760, axis_y + 56, body, "Clicks joined per second")


PICTURES = {"architecture.svg": architecture, "latency-vs-rtt.svg": latency_vs_rtt, "throughput.svg": throughput}


def main(argv: list[str]) -> int:
    check = "--check" in argv
    OUT.mkdir(exist_ok=True)
    stale = []
    for name, draw in PICTURES.items():
        text = draw()
        path = OUT / name
        if check:
            if not path.exists() or path.read_text() != text:
                stale.append(name)
        else:
            path.write_text(text)
    if stale:
        print(f"out of date: {', '.join(stale)} (run python docs/pictures.py)", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
