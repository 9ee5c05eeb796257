"""Prometheus export of the engine's metrics (the optional ``prometheus`` extra).

The engine keeps its metrics as a mapping of Kafka Streams style names (``dropped-records-total``,
``emit-final-records-rate``...). :class:`EngineMetricsCollector` reads that mapping on every
scrape and turns each entry into a Prometheus sample, so whatever names the engine exposes are
exported without a list kept here: ``emit-final-records-total`` becomes the counter
``sessionstore_emit_final_records_total``; every other name becomes a gauge.

Embedded use::

    from prometheus_client import CollectorRegistry
    registry = CollectorRegistry()
    register_engine_metrics(engine, registry, labels={"job": "clicks"})

The source is read from the scraping thread. An engine is not thread-safe, so when it runs in
another thread, pass a callable that returns the last snapshot taken by the engine's own thread
(:class:`MetricsSnapshot` does this).
"""

from __future__ import annotations

import math
import re
import threading
from collections.abc import Callable, Iterator, Mapping
from typing import Any

PREFIX = "sessionstore"
_INVALID = re.compile(r"[^a-zA-Z0-9_]")


def _import_prometheus() -> Any:
    try:
        import prometheus_client
    except ImportError:
        raise ImportError("Prometheus export needs prometheus_client: pip install "
                          "'sessionstore[prometheus]'") from None
    return prometheus_client


def prometheus_name(name: str, prefix: str = PREFIX) -> str:
    """``emit-final-records-rate`` -> ``sessionstore_emit_final_records_rate``."""
    return _INVALID.sub("_", f"{prefix}_{name}" if prefix else name)


class MetricsSnapshot:
    """The latest copy of a metrics mapping, published by the thread that owns the engine and
    read by the scraping thread.

    Args:
        initial: the mapping to serve before the first :meth:`publish`.
    """

    def __init__(self, initial: Mapping[str, float] | None = None) -> None:
        self._lock = threading.Lock()
        self._values: dict[str, float] = dict(initial or {})

    def publish(self, values: Mapping[str, float]) -> None:
        """Replace the served values with a copy of ``values``."""
        copy = dict(values)
        with self._lock:
            self._values = copy

    def __call__(self) -> dict[str, float]:
        with self._lock:
            return dict(self._values)


def _source_callable(source: Any) -> Callable[[], Mapping[str, float]]:
    if callable(source):
        return source  # type: ignore[no-any-return]
    if hasattr(source, "metrics"):
        return lambda: source.metrics
    raise TypeError(f"source must be an engine (with .metrics) or a callable returning a "
                    f"mapping, got {type(source).__name__}")


class EngineMetricsCollector:
    """A ``prometheus_client`` collector that reads a metrics mapping on every scrape.

    Args:
        source: an object with a ``metrics`` mapping (an engine) or a zero-argument callable
            returning one.
        prefix: prepended to every name, with an underscore.
        labels: constant labels added to every sample (e.g. ``{"job": "clicks"}``).

    Raises:
        TypeError: ``source`` has no metrics.
        ImportError: ``prometheus_client`` is not installed.
    """

    def __init__(self, source: Any, prefix: str = PREFIX,
                 labels: Mapping[str, str] | None = None) -> None:
        self._read = _source_callable(source)
        self._prefix = prefix
        self._labels = dict(labels or {})
        self._families = _import_prometheus().metrics_core

    def collect(self) -> Iterator[Any]:
        """One sample family per entry of the mapping; non-finite values are skipped."""
        names, values = list(self._labels), list(self._labels.values())
        for key, value in sorted(self._read().items()):
            number = float(value)
            if not math.isfinite(number):
                continue
            name = prometheus_name(key, self._prefix)
            doc = f"sessionstore engine metric {key!r}"
            if name.endswith("_total"):
                family: Any = self._families.CounterMetricFamily(
                    name[: -len("_total")], doc, labels=names)
            else:
                family = self._families.GaugeMetricFamily(name, doc, labels=names)
            family.add_metric(values, number)
            yield family

    def describe(self) -> list[Any]:
        # No description: the names are those of the mapping at scrape time, so the registry
        # must not check them for clashes once, at registration.
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
    prometheus = _import_prometheus()
    collector = EngineMetricsCollector(source, prefix, labels)
    (registry if registry is not None else prometheus.REGISTRY).register(collector)
    return collector


class MetricsServer:
    """An HTTP endpoint serving a registry at ``http://addr:port/metrics``, until :meth:`close`.

    Raises:
        OSError: the port cannot be bound.
    """

    def __init__(self, registry: Any, port: int, addr: str = "127.0.0.1") -> None:
        self._server, self._thread = _import_prometheus().start_http_server(
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
    registry = _import_prometheus().CollectorRegistry()
    register_engine_metrics(source, registry, labels=labels)
    return MetricsServer(registry, port, addr)
