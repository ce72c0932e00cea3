"""The trainer's figures on Prometheus ``/metrics``: every number a step reports, and running totals.

``opengyre_trainer_step_metric{run, name}`` holds the latest step's value of each metric of its
``TrainingStepCompleted`` event (loss, clip fraction, entropy, engine-trainer KL, TIS and mismatch-masking
shares, grad norm, the breaker, ...); counters add up steps, updates, breaker trips and dropped executions by
kind. Served on ``metrics_port`` (its own registry, one per trainer) within the stack's ``HttpLimits``
(``_metrics_server``).
"""

from __future__ import annotations

import os

from prometheus_client import CollectorRegistry, Counter, Gauge

from opengyre.config import HttpLimits
from opengyre.events import TrainingStepCompleted

from ._metrics_server import MetricsServer

__all__ = ["StepMetrics"]


class StepMetrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.step_metric = Gauge(
            "opengyre_trainer_step_metric", "The latest step's value of each metric it reported.", ["run", "name"],
            registry=self.registry,
        )  # fmt: skip
        self.step = Gauge("opengyre_trainer_step", "The latest step trained.", ["run"], registry=self.registry)
        self.loss = Gauge("opengyre_trainer_loss", "The latest step's loss.", ["run"], registry=self.registry)
        self.steps = Counter("opengyre_trainer_steps", "Steps trained.", ["run"], registry=self.registry)
        self.breaker = Counter(
            "opengyre_trainer_breaker_trips", "Steps whose circuit breaker stopped filtering.", ["run"],
            registry=self.registry,
        )  # fmt: skip
        self.executions = Counter(
            "opengyre_trainer_executions", "Executions consumed, by what became of them.", ["run", "as"],
            registry=self.registry,
        )  # fmt: skip
        self.server: MetricsServer | None = None

    def observe(self, e: TrainingStepCompleted) -> None:
        self.steps.labels(e.run_id).inc()
        self.step.labels(e.run_id).set(e.step)
        self.loss.labels(e.run_id).set(e.loss)
        for name, value in e.metrics.items():
            self.step_metric.labels(e.run_id, name).set(value)
        if e.metrics.get("breaker_trips"):
            self.breaker.labels(e.run_id).inc()
        self.executions.labels(e.run_id, "train").inc(len(e.execution_ids))
        for reason in e.dropped.values():
            self.executions.labels(e.run_id, reason.split(":", 1)[0]).inc()

    def serve(self, port: int, addr: str = "127.0.0.1", limits: HttpLimits | None = None) -> int:
        """Serve ``/metrics`` (port 0: any free one); returns the port. ``limits``: the environment's
        (``OPENGYRE_HTTP_*``) unless given."""
        if self.server is None:
            self.server = MetricsServer(self.registry, port, addr, limits or HttpLimits.from_env(os.environ))
        return self.server.port

    def close(self) -> None:
        if self.server is not None:
            self.server.close()
            self.server = None
