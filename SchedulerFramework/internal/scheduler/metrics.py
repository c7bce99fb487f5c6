"""Prometheus metrics of the scheduler."""

from __future__ import annotations

from prometheus_client import Counter, Gauge, Histogram

from lj_runtimekit.proto.pkg import protocolinfo

_LATENCY_BUCKETS = (
    0.0002,
    0.0005,
    0.001,
    0.0015,
    0.002,
    0.003,
    0.004,
    0.005,
    0.0075,
    0.01,
    0.015,
    0.02,
    0.03,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
)
"""Seconds: fine below 10 ms, where the filter+score target lies."""

FILTER_SCORE_SECONDS = Histogram(
    "lj_scheduler_filter_score_duration_seconds",
    "Time of one scheduling cycle's PreFilter, Filter and Score (per pod).",
    buckets=_LATENCY_BUCKETS,
)
FILTER_SCORE_CPU_SECONDS = Histogram(
    "lj_scheduler_filter_score_cpu_seconds",
    "CPU time of the scheduling thread in PreFilter, Filter and Score (per pod): the cost of"
    " the algorithm itself, without waits for the CPU or the interpreter lock.",
    buckets=_LATENCY_BUCKETS,
)
ATTEMPTS = Counter(
    "lj_scheduler_schedule_attempts_total",
    "Scheduling attempts by result.",
    ["result", "profile"],
)
BIND_SECONDS = Histogram(
    "lj_scheduler_binding_duration_seconds",
    "Time of the binding cycle (PreBind and Bind).",
)
PENDING = Gauge("lj_scheduler_pending_pods", "Pods in the scheduling queue by queue.", ["queue"])
LEADER = Gauge("lj_scheduler_leader", "1 while this replica holds the leader lease.")
PROTOCOL = Gauge(protocolinfo.METRIC, protocolinfo.METRIC_HELP, ["sha256"])
ADMISSION_SECONDS = Histogram(
    "lj_scheduler_admission_duration_seconds",
    "From a device pod's binding to its admission outcome on the node (allocated, running,"
    " failed or deleted): how long the node stays closed to the next device pod.",
    buckets=(0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0),
)
ADMISSION_QUEUED = Gauge(
    "lj_scheduler_admission_queued_bindings",
    "Device pod bindings waiting for their node's previous device pod to be admitted.",
)
PREEMPTIONS = Counter(
    "lj_scheduler_preemptions_total",
    "Pods nominated to a node by preemption (each evicting one or more lower-priority pods).",
)
PREEMPTION_VICTIMS = Histogram(
    "lj_scheduler_preemption_victims",
    "Pods evicted by one preemption.",
    buckets=(1, 2, 4, 8, 16, 32, 64, 128, 256),
)
