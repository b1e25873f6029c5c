"""Prometheus metrics of every Photon process, read from its ``statistics()``.

The launcher gives each process its metrics address in ``PHOTON_METRICS_ADDR`` (``host:port``, planned by
the process's room like its other ports) and its region and name in ``PHOTON_REGION`` /
``PHOTON_PROCESS``; :func:`serve_metrics` starts prometheus-client's HTTP server there (over TLS, client
certificate required, when the process was given ``[tls]`` files) with a collector that reads the
component's statistics at every scrape and exposes them as the component's :class:`MetricKinds` says:

* counters as ``photon_<component>_<field>_total``;
* gauges as ``photon_<component>_<field>`` (booleans 1/0);
* a :class:`~photon.LatencyHistogram` field as a Prometheus histogram in seconds
  (``photon_<component>_<name>_bucket{le=...}``, ``_sum``, ``_count``), with the bounds of
  :data:`LATENCY_BUCKETS_S`;
* a ``{upper bound: count}`` field (sizes in powers of two) as a histogram with power-of-two bounds;
* a dict of numbers as one family with the dict's keys in a label.

Every sample carries the labels ``region``, ``component`` and ``process``; ``photon_up`` is 1 while the
process serves metrics and ``photon_serving`` (where the process has a health service) 1 while its gRPC
health says SERVING. :func:`scrape` reads them back with prometheus-client's own parser.
"""
from __future__ import annotations

import dataclasses
import http.client
import os
import ssl
from dataclasses import dataclass, field
from typing import Callable

from photon._histogram import LatencyHistogram
from photon._tls import tls_files, tls_paths

ENV_METRICS_ADDR = "PHOTON_METRICS_ADDR"
ENV_REGION, ENV_PROCESS = "PHOTON_REGION", "PHOTON_PROCESS"
LABELS = ("region", "component", "process")

LATENCY_BUCKETS_S = (0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0, 5.0, 10.0, 30.0, 60.0)
"""Upper bounds (seconds) of the latency histograms' buckets (``+Inf`` added)."""
SIZE_BUCKETS = tuple(2 ** i for i in range(18))
"""Upper bounds of the size histograms' buckets: 1, 2, 4 .. 131072 (``+Inf`` added)."""


@dataclass(frozen=True)
class MetricKinds:
    """How one component's statistics fields become metrics; declared once, by the room that serves them.

    Every numeric field should be named in ``counters`` or ``gauges`` (a field named in neither is exposed
    as a gauge; the rooms' tests check that none is left out). ``latency_histograms`` maps a field holding
    :meth:`LatencyHistogram.to_json` to the histogram's name (in seconds); ``size_histograms`` maps a
    ``{upper bound: count}`` field to ``(name, field holding the sum or "")``; ``labels`` maps a dict field
    to the label its keys go in (default ``key``); ``skip`` names fields not exposed."""
    counters: frozenset = frozenset()
    gauges: frozenset = frozenset()
    latency_histograms: dict = field(default_factory=dict)
    size_histograms: dict = field(default_factory=dict)
    labels: dict = field(default_factory=dict)
    skip: frozenset = frozenset()

    def unclassified(self, stats) -> list[str]:
        """Numeric fields of ``stats`` this declaration does not name (should be none)."""
        named = (self.counters | self.gauges | set(self.latency_histograms) | set(self.size_histograms)
                 | self.skip)
        return sorted(k for k, v in _fields(stats).items()
                      if k not in named and (isinstance(v, (int, float)) or isinstance(v, dict)))


def _fields(stats) -> dict:
    return dataclasses.asdict(stats) if dataclasses.is_dataclass(stats) else dict(stats)


def _number(value) -> float | None:
    return float(value) if isinstance(value, (int, float)) else None     # bools too: 1.0 / 0.0


class _StatisticsCollector:
    def __init__(self, component: str, statistics: Callable[[], object], kinds: MetricKinds, labels: tuple,
                 serving: Callable[[], bool] | None) -> None:
        self.component = component
        self.statistics = statistics
        self.kinds = kinds
        self.labels = list(labels)
        self.serving = serving

    def _family(self, kind: str, name: str, doc: str, extra: tuple = ()):
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
        cls = CounterMetricFamily if kind == "counter" else GaugeMetricFamily
        return cls(name, doc, labels=[*LABELS, *extra])

    def collect(self):
        try:
            values = _fields(self.statistics())
        except Exception:  # a component stopping between scrapes: report "up" only
            values = {}
        up = self._family("gauge", "photon_up", "1 while the process serves its metrics")
        up.add_metric(self.labels, 1.0)
        yield up
        if self.serving is not None:
            serving = self._family("gauge", "photon_serving", "1 while the process's gRPC health is SERVING")
            serving.add_metric(self.labels, 1.0 if self.serving() else 0.0)
            yield serving
        kinds, prefix = self.kinds, f"photon_{self.component}_"
        for key in sorted(values):
            value = values[key]
            if key in kinds.skip:
                continue
            if key in kinds.latency_histograms:
                yield self._latency(prefix + kinds.latency_histograms[key], key, value)
            elif key in kinds.size_histograms:
                name, sum_field = kinds.size_histograms[key]
                yield self._sizes(prefix + name, key, value, _number(values.get(sum_field)) if sum_field else None)
            elif isinstance(value, dict):
                label = kinds.labels.get(key, "key")
                fam = self._family("counter" if key in kinds.counters else "gauge", prefix + key,
                                   f"{self.component} statistics: {key} by {label}", (label,))
                for k, v in sorted(value.items()):
                    if (n := _number(v)) is not None:
                        fam.add_metric([*self.labels, str(k)], n)
                yield fam
            elif (n := _number(value)) is not None:
                fam = self._family("counter" if key in kinds.counters else "gauge", prefix + key,
                                   f"{self.component} statistics: {key}")
                fam.add_metric(self.labels, n)
                yield fam

    def _latency(self, name: str, key: str, value):
        from prometheus_client.core import HistogramMetricFamily
        from prometheus_client.utils import floatToGoString
        hist = value if isinstance(value, LatencyHistogram) else LatencyHistogram.from_json(value)
        counts = hist.cumulative_counts([b * 1e6 for b in LATENCY_BUCKETS_S])
        bounds = [floatToGoString(b) for b in LATENCY_BUCKETS_S] + ["+Inf"]
        fam = HistogramMetricFamily(name, f"{self.component} {key}, in seconds", labels=list(LABELS))
        fam.add_metric(self.labels, list(zip(bounds, counts)), hist.approx_sum_us() / 1e6)
        return fam

    def _sizes(self, name: str, key: str, value, total: float | None):
        from prometheus_client.core import HistogramMetricFamily
        counts = {int(k): int(v) for k, v in (value or {}).items()}
        buckets, seen = [], 0
        for bound in SIZE_BUCKETS:
            seen = sum(n for k, n in counts.items() if k <= bound)
            buckets.append((str(float(bound)), seen))
        buckets.append(("+Inf", sum(counts.values())))
        fam = HistogramMetricFamily(name, f"{self.component} {key}", labels=list(LABELS))
        fam.add_metric(self.labels, buckets, total)
        return fam


def serve_metrics(component: str, statistics: Callable[[], object], address: str | None = None, *,
                  kinds: MetricKinds | None = None, region: str | None = None, process: str | None = None,
                  serving: Callable[[], bool] | None = None) -> str | None:
    """Serve ``statistics()`` as Prometheus metrics at ``address`` (default: ``PHOTON_METRICS_ADDR``;
    nothing when neither is set), over mutual TLS when this process was given ``[tls]`` files. ``region``
    and ``process`` default to ``PHOTON_REGION`` / ``PHOTON_PROCESS`` (set by the launcher); ``serving``
    reports the process's health. Returns the address served (port 0: the free port taken), or None."""
    address = address or os.environ.get(ENV_METRICS_ADDR)
    if not address:
        return None
    from prometheus_client import CollectorRegistry, start_http_server
    host, port = address.rsplit(":", 1)
    labels = (region if region is not None else os.environ.get(ENV_REGION, ""), component,
              process or os.environ.get(ENV_PROCESS) or component)
    registry = CollectorRegistry()
    registry.register(_StatisticsCollector(component, statistics, kinds or MetricKinds(), labels, serving))
    tls = tls_paths()
    if tls is None:
        server, _ = start_http_server(int(port), addr=host, registry=registry)
    else:
        ca, cert, key = tls
        server, _ = start_http_server(int(port), addr=host, registry=registry, certfile=cert, keyfile=key,
                                      client_cafile=ca, client_auth_required=True)
    return f"{host}:{server.server_port}"


class NamedHTTPSConnection(http.client.HTTPSConnection):
    """HTTPS to an address, checking the server's certificate for ``server_name`` (as the gRPC clients do)."""

    def __init__(self, host: str, port: int, server_name: str, **kw) -> None:
        super().__init__(host, port, **kw)
        self._server_name = server_name

    def connect(self) -> None:
        http.client.HTTPConnection.connect(self)
        self.sock = self._context.wrap_socket(self.sock, server_hostname=self._server_name)


def _fetch(address: str, timeout_s: float) -> str:
    host, port = address.rsplit(":", 1)
    tls = tls_files()
    if tls is None:
        conn = http.client.HTTPConnection(host, int(port), timeout=timeout_s)
    else:
        ca, cert, key = tls_paths()
        ctx = ssl.create_default_context(ssl.Purpose.SERVER_AUTH, cafile=ca)
        ctx.load_cert_chain(cert, key)
        conn = NamedHTTPSConnection(host, int(port), tls.server_name, timeout=timeout_s, context=ctx)
    try:
        conn.request("GET", "/metrics")
        response = conn.getresponse()
        if response.status != 200:
            raise OSError(f"metrics at {address}: HTTP {response.status}")
        return response.read().decode()
    except (http.client.HTTPException, ssl.SSLError) as e:
        raise OSError(f"metrics at {address}: {e}") from None
    finally:
        conn.close()


def scrape(address: str, timeout_s: float = 1.0) -> dict[str, float] | None:
    """The metrics a process serves at ``address`` (over TLS when this process has ``[tls]`` files), or None
    when it does not answer. Read with prometheus-client's parser; keys are sample names
    (``photon_joiner_joined_total``, ``photon_up``), with the labels other than region, component and
    process appended in Prometheus's form (``photon_dispatcher_join_latency_seconds_bucket{le="0.1"}``)."""
    from prometheus_client.parser import text_string_to_metric_families
    try:
        text = _fetch(address, timeout_s)
    except OSError:
        return None
    out = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            extra = {k: v for k, v in sample.labels.items() if k not in LABELS}
            key = sample.name + ("{" + ",".join(f'{k}="{v}"' for k, v in sorted(extra.items())) + "}"
                                 if extra else "")
            out[key] = float(sample.value)
    return out


def histogram_quantile(metrics: dict, name: str, q: float, before: dict | None = None) -> float | None:
    """The ``q`` quantile (0..1) of histogram ``name`` in a :func:`scrape` result, over the observations
    made since ``before`` (an earlier scrape) when given, else since the start; linear within a bucket,
    as Prometheus's ``histogram_quantile``. None when there are no observations."""
    prefix = f'{name}_bucket{{le="'
    buckets = []
    for key, value in metrics.items():
        if key.startswith(prefix):
            le = key[len(prefix):-2]
            then = before.get(key, 0.0) if before else 0.0
            buckets.append((float(le), value - then))
    buckets.sort()
    if not buckets or buckets[-1][1] <= 0:
        return None
    rank = q * buckets[-1][1]
    lower, below = 0.0, 0.0
    for upper, count in buckets:
        if count >= rank:
            if upper == float("inf"):
                return lower
            return lower + (upper - lower) * ((rank - below) / (count - below) if count > below else 1.0)
        lower, below = upper, count
    return lower
