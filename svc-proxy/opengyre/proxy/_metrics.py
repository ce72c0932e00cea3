"""The gateway's ``/metrics`` through prometheus-client: calls, rejections, drift, reroutes, engines, queue,
recorder. A collector reads the live objects at each scrape (no second bookkeeping to drift from the first)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

if TYPE_CHECKING:
    from ._gateway import Gateway

__all__ = ["GatewayCollector", "render_metrics"]


def _counter(name: str, help_text: str, value: float) -> CounterMetricFamily:
    return CounterMetricFamily(name, help_text, value=value)


def _gauge(name: str, help_text: str, value: float) -> GaugeMetricFamily:
    return GaugeMetricFamily(name, help_text, value=value)


class GatewayCollector(Collector):
    def __init__(self, gw: Gateway) -> None:
        self.gw = gw

    def collect(self) -> Iterator[Metric]:
        gw, st, rec = self.gw, self.gw.stats, self.gw.recorder
        yield _counter("opengyre_proxy_calls_total", "Model calls answered and recorded.", st.calls)
        rejected = CounterMetricFamily(
            "opengyre_proxy_rejected_total", "Calls refused, by HTTP status.", labels=["status"]
        )
        for status, n in sorted(st.rejected.items()):
            rejected.add_metric([str(status)], n)
        yield rejected
        yield _counter("opengyre_proxy_drift_total", "Calls whose re-rendered prompt differed.", st.drift)
        yield _counter("opengyre_proxy_rerouted_total", "Engine attempts re-issued elsewhere.", st.rerouted)
        engines = gw.pool.engines()
        by_state = GaugeMetricFamily("opengyre_proxy_engines", "Engines in the pool, by state.", labels=["state"])
        for s in ("active", "unhealthy", "draining"):
            by_state.add_metric([s], sum(1 for h in engines if h.state == s))
        yield by_state
        inflight = GaugeMetricFamily("opengyre_proxy_inflight", "Requests in flight per engine.", labels=["engine"])
        for h in engines:
            inflight.add_metric([h.engine_id], len(h.inflight))
        yield inflight
        yield _gauge("opengyre_proxy_queue_waiting", "Requests waiting for capacity.", gw.pool.waiting)
        yield _counter("opengyre_proxy_queue_rejected_total", "Requests refused for capacity.", gw.pool.rejected)
        yield _counter("opengyre_proxy_recorded_total", "Model-call events appended to the log.", rec.recorded)
        yield _counter(
            "opengyre_proxy_record_failed_total",
            "Calls answered with an error because their event could not be written to the outbox.",
            rec.failed,
        )
        yield _gauge(
            "opengyre_proxy_outbox_events", "Answered calls whose events wait in the outbox for the log.", rec.pending
        )
        yield _gauge("opengyre_proxy_outbox_bytes", "Bytes of those events.", rec.outbox.pending_bytes)
        yield _counter(
            "opengyre_proxy_outbox_refused_total", "Calls refused (503/529) because the outbox was full.", rec.refused
        )
        yield _counter(
            "opengyre_proxy_record_send_failures_total",
            "Attempts to hand the outbox to the log that failed (each is retried).",
            rec.send_failures,
        )
        yield _counter(
            "opengyre_proxy_payload_bytes_total",
            "Encoded token payload bytes stored (tokens, logprobs, context).",
            rec.payload_bytes,
        )
        yield _gauge("opengyre_proxy_executions", "Executions with live TITO state.", len(gw.executions()))


def render_metrics(gw: Gateway) -> str:
    """The Prometheus text exposition of the gateway's figures, as prometheus-client writes it."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(GatewayCollector(gw))
    return generate_latest(registry).decode()
