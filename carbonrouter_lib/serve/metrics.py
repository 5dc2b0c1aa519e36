"""Prometheus metrics of the router (``GET /metrics``), one registry per router.

Counters of requests, realized carbon and energy per region and deployment, switches, gate
blocks, best-effort and rejected queries, retries; histograms of the decision latency and the
proxy's overhead per request; the cache estimate's error against what engines report; and the
carbon signal in force per zone with its provenance (provider, average / marginal, estimated,
live / cache / stale / default) and age.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

__all__ = ["RouterMetrics"]

_LATENCY_BUCKETS = (5e-5, 1e-4, 2.5e-4, 5e-4, 1e-3, 2.5e-3, 5e-3, 1e-2, 2.5e-2, 5e-2, 0.1, 0.25,
                    0.5, 1.0)
_TOKEN_BUCKETS = (-4096, -1024, -256, -64, -16, -1, 0, 1, 16, 64, 256, 1024, 4096)


class RouterMetrics:
    """All metrics of one router, in their own :class:`CollectorRegistry`."""

    def __init__(self) -> None:
        r = self.registry = CollectorRegistry()
        labels = ("deployment", "region")
        self.requests = Counter("carbonrouter_requests", "Requests by outcome (ok, error, "
                                "rejected)", ("deployment", "region", "outcome"), registry=r)
        self.carbon = Counter("carbonrouter_gco2e", "Realized operational carbon, gCO2e",
                              labels, registry=r)
        self.energy = Counter("carbonrouter_energy_kwh", "Realized energy (Eq. 4), kWh", labels,
                              registry=r)
        self.switches = Counter("carbonrouter_switches", "Turns served on another deployment "
                                "than the session's previous one", registry=r)
        self.gate_blocks = Counter("carbonrouter_gate_blocks", "Switches the gate blocked",
                                   registry=r)
        self.best_effort = Counter("carbonrouter_best_effort", "Queries served best-effort (no "
                                   "deployment met the TTFT bound)", registry=r)
        self.rejected = Counter("carbonrouter_rejected", "Queries no deployment could serve",
                                registry=r)
        self.retries = Counter("carbonrouter_retries", "Engine failures retried elsewhere",
                               ("deployment", "reason"), registry=r)
        self.decision = Histogram("carbonrouter_decision_seconds", "Time of one routing "
                                  "decision (state, context, feasibility, policy), s",
                                  buckets=_LATENCY_BUCKETS, registry=r)
        self.overhead = Histogram("carbonrouter_overhead_seconds", "Proxy time per request "
                                  "outside the engine call, s", buckets=_LATENCY_BUCKETS,
                                  registry=r)
        self.cache_error = Histogram("carbonrouter_cache_estimate_error_tokens", "Router's "
                                     "L(a) minus the engine-reported cached tokens",
                                     buckets=_TOKEN_BUCKETS, registry=r)
        self.cache_reported = Counter("carbonrouter_cached_tokens_reported", "Cached prompt "
                                      "tokens the engines reported", ("deployment",), registry=r)
        self.cache_estimated = Counter("carbonrouter_cached_tokens_estimated", "Cached prompt "
                                       "tokens the router estimated where engines reported",
                                       ("deployment",), registry=r)
        self.cooling = Gauge("carbonrouter_deployment_cooling_down", "1 while a deployment is "
                             "left out after a failure", ("deployment",), registry=r)
        sig = ("region", "zone", "provider", "kind", "estimated", "source")
        self.intensity = Gauge("carbonrouter_carbon_intensity_gco2_per_kwh", "Carbon "
                               "intensity in force, gCO2e/kWh, with its provenance", sig,
                               registry=r)
        self.signal_time = Gauge("carbonrouter_carbon_signal_timestamp_seconds", "Time the "
                                 "intensity in force is for, s since the epoch", ("zone",),
                                 registry=r)
        self.signal_failures = Counter("carbonrouter_carbon_signal_failures", "Failed carbon "
                                       "fetches", ("zone",), registry=r)
        self._intensity_labels: dict[str, tuple] = {}

    def set_reading(self, region: str, reading) -> None:
        """Show ``reading`` (:class:`~carbonrouter_lib.serve.carbon_providers.Reading`) as the
        intensity in force in ``region`` (its previous label set is removed)."""
        labels = (region, reading.zone, reading.provider, reading.kind,
                  str(reading.estimated).lower(), reading.source)
        old = self._intensity_labels.get(region)
        if old is not None and old != labels:
            self.intensity.remove(*old)
        self._intensity_labels[region] = labels
        self.intensity.labels(*labels).set(reading.gco2_per_kwh)
        self.signal_time.labels(reading.zone).set(reading.timestamp)

    def render(self) -> bytes:
        """The Prometheus text exposition."""
        return generate_latest(self.registry)
