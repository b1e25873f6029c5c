"""Prometheus metrics of every Photon process, read from its ``statistics()``.

The launcher gives each process its metrics address in ``PHOTON_METRICS_ADDR`` (``host:port``, planned by
the process's room like its other ports); :func:`serve_metrics` starts prometheus-client's HTTP server
there with a collector that turns every number of the component's ``...Statistics`` dataclass into a
gauge ``photon_<component>_<field>`` (and dict fields such as ``join_latency_ms`` into one gauge per key).
"""
from __future__ import annotations

import dataclasses
import os
from typing import Callable

ENV_METRICS_ADDR = "PHOTON_METRICS_ADDR"


def _numbers(stats) -> dict[str, float]:
    data = dataclasses.asdict(stats) if dataclasses.is_dataclass(stats) else dict(stats)
    out = {}
    for key, value in data.items():
        if isinstance(value, (int, float)):       # bools too: 1.0 / 0.0
            out[key] = float(value)
        elif isinstance(value, dict):
            for k, v in value.items():
                if isinstance(v, (int, float)) and not isinstance(v, bool):
                    out[f"{key}_{k}"] = float(v)
    return out


class _StatisticsCollector:
    def __init__(self, component: str, statistics: Callable[[], object], labels: dict) -> None:
        self.component = component
        self.statistics = statistics
        self.labels = labels

    def collect(self):
        from prometheus_client.core import GaugeMetricFamily
        try:
            numbers = _numbers(self.statistics())
        except Exception:  # a component stopping between scrapes: report "up" only
            numbers = {}
        up = GaugeMetricFamily("photon_up", "1 while the process serves", labels=list(self.labels))
        up.add_metric(list(self.labels.values()), 1.0)
        yield up
        for key, value in sorted(numbers.items()):
            g = GaugeMetricFamily(f"photon_{self.component}_{key}", f"{self.component} statistics: {key}",
                                  labels=list(self.labels))
            g.add_metric(list(self.labels.values()), value)
            yield g


def serve_metrics(component: str, statistics: Callable[[], object], address: str | None = None,
                  **labels: str) -> str | None:
    """Serve ``statistics()`` as Prometheus metrics at ``address`` (default: ``PHOTON_METRICS_ADDR``;
    nothing when neither is set). Returns the address served, or None."""
    address = address or os.environ.get(ENV_METRICS_ADDR)
    if not address:
        return None
    from prometheus_client import CollectorRegistry, start_http_server
    host, port = address.rsplit(":", 1)
    registry = CollectorRegistry()
    registry.register(_StatisticsCollector(component, statistics, labels))
    start_http_server(int(port), addr=host, registry=registry)
    return address


def scrape(address: str, timeout_s: float = 1.0) -> dict[str, float] | None:
    """The metrics a process serves at ``address`` as ``{name: value}`` (labels dropped), or None when it
    does not answer."""
    import urllib.request
    try:
        with urllib.request.urlopen(f"http://{address}/metrics", timeout=timeout_s) as r:
            text = r.read().decode()
    except OSError:
        return None
    out = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name, _, value = line.rpartition(" ")
            try:
                out[name.split("{", 1)[0]] = float(value)
            except ValueError:
                continue
    return out
