"""Prometheus text for the gateway's ``/metrics``: calls, rejections, drift, reroutes, engines, queue, recorder."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ._gateway import Gateway

__all__ = ["render_metrics"]


def _line(name: str, value: float, labels: dict[str, str] | None = None) -> str:
    if labels:
        inner = ",".join(f'{k}="{v}"' for k, v in sorted(labels.items()))
        return f"{name}{{{inner}}} {value:g}"
    return f"{name} {value:g}"


def render_metrics(gw: Gateway) -> str:
    """Counters and gauges read from the live objects (no second bookkeeping to drift from the first)."""
    out: list[str] = []

    def metric(name: str, kind: str, help_text: str, samples: list[tuple[float, dict[str, str] | None]]) -> None:
        out.append(f"# HELP {name} {help_text}")
        out.append(f"# TYPE {name} {kind}")
        out.extend(_line(name, v, labels) for v, labels in samples)

    st = gw.stats
    metric("opengyre_proxy_calls_total", "counter", "Model calls answered and recorded.", [(st.calls, None)])
    metric(
        "opengyre_proxy_rejected_total",
        "counter",
        "Calls refused, by HTTP status.",
        [(n, {"status": s}) for s, n in sorted(st.rejected.items())] or [(0, {"status": "none"})],
    )
    metric("opengyre_proxy_drift_total", "counter", "Calls whose re-rendered prompt differed.", [(st.drift, None)])
    metric("opengyre_proxy_rerouted_total", "counter", "Engine attempts re-issued elsewhere.", [(st.rerouted, None)])
    engines = gw.pool.engines()
    metric(
        "opengyre_proxy_engines",
        "gauge",
        "Engines in the pool, by state.",
        [(sum(1 for h in engines if h.state == s), {"state": s}) for s in ("active", "unhealthy", "draining")],
    )
    metric(
        "opengyre_proxy_inflight",
        "gauge",
        "Requests in flight per engine.",
        [(len(h.inflight), {"engine": h.engine_id}) for h in engines] or [(0, {"engine": "none"})],
    )
    metric("opengyre_proxy_queue_waiting", "gauge", "Requests waiting for capacity.", [(gw.pool.waiting, None)])
    metric(
        "opengyre_proxy_queue_rejected_total", "counter", "Requests refused for capacity.", [(gw.pool.rejected, None)]
    )
    rec = gw.recorder
    metric("opengyre_proxy_recorded_total", "counter", "Model-call events appended to the log.", [(rec.recorded, None)])
    metric(
        "opengyre_proxy_record_failed_total",
        "counter",
        "Calls answered with an error because their event could not be written to the outbox.",
        [(rec.failed, None)],
    )
    metric(
        "opengyre_proxy_outbox_events",
        "gauge",
        "Answered calls whose events wait in the outbox for the log.",
        [(rec.pending, None)],
    )
    metric("opengyre_proxy_outbox_bytes", "gauge", "Bytes of those events.", [(rec.outbox.pending_bytes, None)])
    metric(
        "opengyre_proxy_outbox_refused_total",
        "counter",
        "Calls refused (503/529) because the outbox was full.",
        [(rec.refused, None)],
    )
    metric(
        "opengyre_proxy_record_send_failures_total",
        "counter",
        "Attempts to hand the outbox to the log that failed (each is retried).",
        [(rec.send_failures, None)],
    )
    metric(
        "opengyre_proxy_payload_bytes_total",
        "counter",
        "Encoded token payload bytes stored (tokens, logprobs, context).",
        [(rec.payload_bytes, None)],
    )
    metric("opengyre_proxy_executions", "gauge", "Executions with live TITO state.", [(len(gw.executions()), None)])
    return "\n".join(out) + "\n"
