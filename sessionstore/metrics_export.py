"""Prometheus export of the engine's metrics (the optional ``prometheus`` extra).

The engine keeps Kafka Streams style counters (``engine.metrics``: ``dropped-records``,
``emit-final-records-total``...) and lifetime latency histograms
(``engine.latency_histograms``). :class:`EngineMetricsCollector` reads both on every scrape
and exports the ones listed in :data:`EXPORTED`, under Prometheus' naming rules:

- running totals are counters whose names end in ``_total``;
- durations are in seconds, named ``_seconds``, and latencies are histograms;
- gauges only for levels that go up and down (the watermark);
- no precomputed rates or averages: Prometheus derives them (``rate(x_total[5m])``,
  ``histogram_quantile``, ``x_seconds_sum / x_seconds_count``).

The families are ``prometheus_client``'s own (``CounterMetricFamily``,
``HistogramMetricFamily``...) in a ``CollectorRegistry``, served by its HTTP server or written
with its ``write_to_textfile``.

Embedded use::

    from prometheus_client import CollectorRegistry
    registry = CollectorRegistry()
    register_engine_metrics(engine, registry, labels={"job": "clicks"})

The source is read from the scraping thread. An engine is not thread-safe, so when it runs in
another thread, pass a :class:`MetricsSnapshot` that the engine's own thread publishes to
(after each batch, say) with :func:`read_engine`.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .timeutil import INT64_MIN

if TYPE_CHECKING:  # the CLI imports this module; a run without the store must not load it
    from .store.metered import HistogramReading

PREFIX = "sessionstore"


def require_prometheus() -> Any:
    """The ``prometheus_client`` module.

    Raises:
        ImportError: it is not installed, naming the extra that installs it.
    """
    try:
        import prometheus_client
    except ImportError:
        raise ImportError("Prometheus export needs prometheus_client: pip install "
                          "'sessionstore[prometheus]'") from None
    return prometheus_client


@dataclass(frozen=True)
class Exported:
    """One exported metric: its Prometheus ``name`` (without ``PREFIX_``; counters with their
    ``_total``), ``kind`` (counter, gauge or histogram), the ``source`` entry it is read from
    (in the metrics mapping, or the histograms for a histogram), ``scale`` from the source's
    unit to the exported one, and the ``help`` text that says what is counted."""

    name: str
    kind: str
    source: str
    help: str
    scale: float = 1.0


_STORE_OPS = {
    "put": "store put call (one call may write many sessions)",
    "remove": "store remove call (one call may remove many sessions)",
    "fetch": "store read of one key's sessions",
    "find-sessions": "store scan of all keys' sessions by end time",
    "commit": "store commit (a durable, versioned checkpoint of the state)",
}

#: Every metric exported, in exposition order. docs/operations.md lists the same names.
EXPORTED: tuple[Exported, ...] = (
    Exported("input_records_total", "counter", "records-in",
             "Events handed to the engine, dropped ones included."),
    Exported("dropped_records_total", "counter", "dropped-records",
             "Events dropped without changing any session: late ones (their window had "
             "closed when they arrived) and those with a null or non-positive dynamic gap."),
    Exported("dropped_invalid_gap_records_total", "counter", "dropped-invalid-gap-records",
             "Events dropped because their dynamic gap was null or not positive (also in "
             "dropped_records_total)."),
    Exported("emitted_records_total", "counter", "emitted-records",
             "Session records emitted: updates, retractions and final sessions."),
    Exported("emit_final_records_total", "counter", "emit-final-records-total",
             "Sessions emitted as final, once each, when they closed (emit on window close)."),
    Exported("store_dropped_records_total", "counter", "store-dropped-records",
             "Session writes the store refused because their segment had already expired."),
    Exported("store_expired_segments_total", "counter", "expired-segments",
             "Store segments dropped whole because retention passed them."),
    Exported("store_put_records_total", "counter", "store-put-total",
             "Sessions written to the store by put calls."),
    Exported("store_remove_records_total", "counter", "store-remove-total",
             "Sessions removed from the store (merged away or re-cut)."),
    Exported("cli_input_records_total", "counter", "cli-input-records-total",
             "Input rows the sessionize command read and handed to the engine."),
    Exported("cli_output_records_total", "counter", "cli-output-records-total",
             "Session rows the sessionize command wrote to its output."),
    Exported("cli_times_floored_total", "counter", "cli-times-floored-to-ms-total",
             "Input times with a sub-millisecond part, floored to their millisecond."),
    Exported("cli_row_path_batches_total", "counter", "cli-row-path-batches-total",
             "Input batches the columnar path could not take, fed event by event instead."),
    Exported("watermark_seconds", "gauge", "watermark-ms",
             "The engine's event-time watermark, in seconds since the epoch; sessions ending "
             "at or before it are complete (absent before the first event).", 0.001),
    Exported("emit_final_latency_seconds", "histogram", "emit-final-latency",
             "Event time from a session's close (its end plus grace) to the watermark that "
             "emitted it as final."),
    *(Exported(f"store_{op.replace('-', '_')}_latency_seconds", "histogram",
               f"store-{op}-latency", f"Wall-clock time of each {what}.")
      for op, what in _STORE_OPS.items()),
)


@dataclass(frozen=True)
class MetricsReading:
    """One consistent reading of an engine: its ``values`` (the metrics mapping, plus
    ``watermark-ms`` and any caller counters) and its latency ``histograms``."""

    values: Mapping[str, float] = field(default_factory=dict)
    histograms: Mapping[str, HistogramReading] = field(default_factory=dict)


def read_engine(engine: Any, extra: Mapping[str, float] | None = None) -> MetricsReading:
    """A :class:`MetricsReading` of ``engine`` (a ``SessionAggregator``), with ``extra`` values
    (a caller's own counters) added. Call it from the thread that runs the engine."""
    values: dict[str, float] = dict(engine.metrics)
    watermark = getattr(engine, "watermark", INT64_MIN)
    if watermark != INT64_MIN:
        values["watermark-ms"] = watermark
    values.update(extra or {})
    return MetricsReading(values, dict(getattr(engine, "latency_histograms", {})))


class MetricsSnapshot:
    """The latest :class:`MetricsReading`, published by the thread that owns the engine and
    read by the scraping thread.

    Args:
        initial: the reading (or a plain metrics mapping) served before the first
            :meth:`publish`.
    """

    def __init__(self, initial: MetricsReading | Mapping[str, float] | None = None) -> None:
        self._lock = threading.Lock()
        self._reading = _as_reading(initial)

    def publish(self, reading: MetricsReading | Mapping[str, float]) -> None:
        """Serve ``reading`` (or a plain metrics mapping) from now on."""
        copy = _as_reading(reading)
        with self._lock:
            self._reading = copy

    def __call__(self) -> MetricsReading:
        with self._lock:
            return self._reading


def _as_reading(source: MetricsReading | Mapping[str, float] | None) -> MetricsReading:
    if isinstance(source, MetricsReading):
        return MetricsReading(dict(source.values), dict(source.histograms))
    return MetricsReading(dict(source or {}), {})


def _source_callable(source: Any) -> Callable[[], MetricsReading]:
    if hasattr(source, "metrics"):
        return lambda: read_engine(source)
    if callable(source):
        return lambda: _as_reading(source())
    raise TypeError(f"source must be an engine (with .metrics) or a callable returning a "
                    f"MetricsReading or a metrics mapping, got {type(source).__name__}")


def _bucket_bound(bound_s: float) -> str:
    return repr(float(bound_s))


class EngineMetricsCollector:
    """A ``prometheus_client`` collector that reads an engine's metrics on every scrape and
    yields the families of :data:`EXPORTED` whose source is present.

    Args:
        source: an engine (a ``SessionAggregator``), or a zero-argument callable returning a
            :class:`MetricsReading` or a metrics mapping (a :class:`MetricsSnapshot`).
        prefix: prepended to every name, with an underscore.
        labels: constant labels added to every sample (e.g. ``{"job": "clicks"}``).

    Raises:
        TypeError: ``source`` has no metrics.
        ImportError: ``prometheus_client`` is not installed.
    """

    def __init__(self, source: Any, prefix: str = PREFIX,
                 labels: Mapping[str, str] | None = None) -> None:
        self._read = _source_callable(source)
        self._prefix = f"{prefix}_" if prefix else ""
        self._labels = dict(labels or {})
        self._families = require_prometheus().metrics_core

    def collect(self) -> Iterator[Any]:
        reading = self._read()
        names, values = list(self._labels), list(self._labels.values())
        families = self._families
        for metric in EXPORTED:
            name = self._prefix + metric.name
            if metric.kind == "histogram":
                histogram = reading.histograms.get(metric.source)
                if histogram is None:
                    continue
                family: Any = families.HistogramMetricFamily(name, metric.help, labels=names)
                cumulative, buckets = 0, []
                for bound, count in zip(histogram.bounds_s, histogram.counts, strict=False):
                    cumulative += count
                    buckets.append((_bucket_bound(bound), cumulative))
                buckets.append(("+Inf", histogram.count))
                family.add_metric(values, buckets, histogram.sum_s)
                yield family
                continue
            if metric.source not in reading.values:
                continue
            number = float(reading.values[metric.source]) * metric.scale
            if metric.kind == "counter":
                family = families.CounterMetricFamily(name[: -len("_total")], metric.help,
                                                      labels=names)
            else:
                family = families.GaugeMetricFamily(name, metric.help, labels=names)
            family.add_metric(values, number)
            yield family

    def describe(self) -> list[Any]:
        # Nothing described up front: which families appear depends on the source (a dynamic
        # gap, the CLI's counters), so the registry must not fix them at registration.
        return []


def register_engine_metrics(source: Any, registry: Any = None, *, prefix: str = PREFIX,
                            labels: Mapping[str, str] | None = None) -> EngineMetricsCollector:
    """Register the engine's metrics in ``registry`` (the default registry when None).

    Returns:
        The collector; ``registry.unregister(collector)`` removes it.

    Raises:
        TypeError: ``source`` has no metrics.
        ImportError: ``prometheus_client`` is not installed.
    """
    prometheus = require_prometheus()
    collector = EngineMetricsCollector(source, prefix, labels)
    (registry if registry is not None else prometheus.REGISTRY).register(collector)
    return collector


def engine_registry(source: Any, labels: Mapping[str, str] | None = None) -> Any:
    """A new ``CollectorRegistry`` holding only ``source``'s metrics.

    Raises:
        ImportError: ``prometheus_client`` is not installed.
    """
    registry = require_prometheus().CollectorRegistry()
    register_engine_metrics(source, registry, labels=labels)
    return registry


def write_metrics_file(registry: Any, path: str | Path) -> None:
    """Write ``registry`` in the text format to ``path``, for node_exporter's textfile
    collector (which reads ``*.prom`` files in its directory). The text goes to a temporary
    file beside ``path`` that is then renamed over it, so a reader never sees half a file.

    Raises:
        OSError: ``path``'s directory is missing or not writable.
    """
    require_prometheus().write_to_textfile(str(path), registry)


class MetricsServer:
    """An HTTP endpoint serving a registry at ``http://addr:port/metrics``, until :meth:`close`.

    Raises:
        OSError: the port cannot be bound.
    """

    def __init__(self, registry: Any, port: int, addr: str = "127.0.0.1") -> None:
        self._server, self._thread = require_prometheus().start_http_server(
            port, addr=addr, registry=registry)

    @property
    def port(self) -> int:
        """The bound port (useful when 0 was asked for)."""
        return int(self._server.server_port)

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5)


def serve_metrics(source: Any, port: int, addr: str = "127.0.0.1",
                  labels: Mapping[str, str] | None = None) -> MetricsServer:
    """Serve ``source``'s metrics (see :class:`EngineMetricsCollector`) on their own registry.

    Raises:
        OSError: the port cannot be bound.
        ImportError: ``prometheus_client`` is not installed.
    """
    return MetricsServer(engine_registry(source, labels), port, addr)
