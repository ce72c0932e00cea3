"""The gateway's ``/metrics`` through prometheus-client. Each part owns its figures (the gateway its calls, the
pool its engines and queue, the recorder its outbox) as a ``metrics()`` yielding families; this module only
renders them, so it imports none of those parts. A collector reads the live objects at each scrape (no second
bookkeeping to drift from the first)."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Sequence

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

__all__ = ["MetricSource", "counter", "gauge", "render_metrics"]

MetricSource = Callable[[], Iterable[Metric]]


def counter(name: str, help_text: str, value: float) -> CounterMetricFamily:
    return CounterMetricFamily(name, help_text, value=value)


def gauge(name: str, help_text: str, value: float) -> GaugeMetricFamily:
    return GaugeMetricFamily(name, help_text, value=value)


class _Sources(Collector):
    def __init__(self, sources: Sequence[MetricSource]) -> None:
        self.sources = sources

    def collect(self) -> Iterator[Metric]:
        for source in self.sources:
            yield from source()


def render_metrics(sources: Sequence[MetricSource]) -> str:
    """The Prometheus text exposition of the sources' families, in order, as prometheus-client writes it."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_Sources(sources))
    return generate_latest(registry).decode()
