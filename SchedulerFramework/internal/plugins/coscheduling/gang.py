"""Which gang a pod belongs to, and the gang's rules (pure, no I/O).

A gang is either

- the pods of one JobSet (pod label `jobset.sigs.k8s.io/jobset-name`); its
  size is the sum over the JobSet's replicated jobs of replicas x
  parallelism, read from the JobSet object (when its CRD is installed) or,
  overriding it, the pod annotation `annotations.gang_min_members`; or
- the pods carrying the protocol annotation `annotations.gang_group` (a group
  name in the pod's namespace) with `annotations.gang_min_members`.

Optional annotations: `annotations.gang_timeout_seconds` (how long reserved
members wait for the rest) and `annotations.gang_topology`
(`required|preferred`). Members of one Job (JobSet label
`jobset.sigs.k8s.io/job-key`) are placed closest together.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass

from lj_runtimekit.proto.pkg.protocol import Protocol
from lj_runtimekit.schedulerframework.internal.cache.podinfo import PodInfo

JOBSET_NAME = "jobset.sigs.k8s.io/jobset-name"
REPLICATED_JOB = "jobset.sigs.k8s.io/replicatedjob-name"
JOB_INDEX = "jobset.sigs.k8s.io/job-index"
JOB_KEY = "jobset.sigs.k8s.io/job-key"
EXCLUSIVE_TOPOLOGY = "alpha.jobset.sigs.k8s.io/exclusive-topology"
TOPOLOGY_MODES = ("required", "preferred")


class GangError(ValueError):
    """A bad group definition; the message names the annotation or label and the pod."""


@dataclass(frozen=True)
class GangSpec:
    key: str
    """namespace/name: the gang's identity"""
    min_members: int
    timeout_s: float
    topology: str
    job: str
    """the Job inside the gang (JobSet job key); "" for a plain pod group"""
    exclusive_key: str | None
    jobset: bool


JobSetSize = Callable[[str, str], "int | None"]
"""(namespace, JobSet name) -> replicas x parallelism summed, None when unknown."""


def jobset_size(obj: Mapping[str, object]) -> int:
    """Members of a JobSet object: sum of replicas x parallelism of its replicated jobs."""
    spec = obj.get("spec")
    total = 0
    for rj in (spec.get("replicatedJobs") if isinstance(spec, dict) else None) or ():
        if not isinstance(rj, dict):
            continue
        replicas = int(rj.get("replicas", 1) or 0)
        job_spec = ((rj.get("template") or {}).get("spec")) or {}
        parallelism = job_spec.get("parallelism")
        total += replicas * int(1 if parallelism is None else parallelism)
    return total


def _positive_int(pod: PodInfo, key: str, value: str) -> int:
    try:
        n = int(value)
    except ValueError:
        n = 0
    if n < 1:
        raise GangError(f"pod {pod.key}: annotation {key}={value!r} must be an integer >= 1")
    return n


def gang_of(
    pod: PodInfo, protocol: Protocol, default_timeout_s: float, size_of: JobSetSize
) -> GangSpec | None:
    """The pod's gang, None when it belongs to none; GangError for a bad definition."""
    a = protocol.annotations
    ann, labels = pod.annotations, pod.labels
    group = ann.get(a.gang_group)
    jobset = labels.get(JOBSET_NAME)
    raw_min = ann.get(a.gang_min_members)
    if group is None and jobset is None:
        if raw_min is not None:
            raise GangError(
                f"pod {pod.key}: annotation {a.gang_min_members} is set but the pod names no "
                f"gang (annotation {a.gang_group}) and belongs to no JobSet"
            )
        return None
    if group is not None and not group.strip():
        raise GangError(f"pod {pod.key}: annotation {a.gang_group} is empty")
    minimum = _positive_int(pod, a.gang_min_members, raw_min) if raw_min is not None else None
    if group is not None:
        name = group.strip()
        if minimum is None:
            raise GangError(
                f"pod {pod.key}: gang group {name!r} (annotation {a.gang_group}) has no "
                f"minimum: set annotation {a.gang_min_members}"
            )
    else:
        assert jobset is not None
        name = jobset
        size = size_of(pod.namespace, jobset)
        if minimum is None:
            if size is None:
                raise GangError(
                    f"pod {pod.key}: the size of JobSet {pod.namespace}/{jobset} is unknown: "
                    f"the JobSet object is not readable (is the JobSet CRD installed?) and the "
                    f"pod has no annotation {a.gang_min_members}"
                )
            minimum = size
        elif size is not None and minimum > size:
            raise GangError(
                f"pod {pod.key}: annotation {a.gang_min_members}={minimum} is larger than "
                f"JobSet {pod.namespace}/{jobset} can ever be ({size} pods: replicas x "
                "parallelism of its replicated jobs)"
            )
        if minimum < 1:
            raise GangError(f"pod {pod.key}: JobSet {pod.namespace}/{jobset} has no pods")
    timeout = default_timeout_s
    raw_timeout = ann.get(a.gang_timeout_seconds)
    if raw_timeout is not None:
        try:
            timeout = float(raw_timeout)
        except ValueError:
            timeout = 0.0
        if not timeout > 0:
            raise GangError(
                f"pod {pod.key}: annotation {a.gang_timeout_seconds}={raw_timeout!r} must be "
                "a number of seconds > 0"
            )
    topology = ann.get(a.gang_topology, "preferred")
    if topology not in TOPOLOGY_MODES:
        raise GangError(
            f"pod {pod.key}: annotation {a.gang_topology}={topology!r} must be one of "
            f"{', '.join(TOPOLOGY_MODES)}"
        )
    job = labels.get(JOB_KEY) or ""
    if not job and jobset is not None and REPLICATED_JOB in labels:
        job = f"{labels[REPLICATED_JOB]}-{labels.get(JOB_INDEX, '0')}"
    exclusive = ann.get(EXCLUSIVE_TOPOLOGY) or None
    if exclusive is not None and jobset is None:
        raise GangError(
            f"pod {pod.key}: annotation {EXCLUSIVE_TOPOLOGY} applies to JobSet pods only "
            f"(label {JOBSET_NAME} missing)"
        )
    return GangSpec(
        key=f"{pod.namespace}/{name}",
        min_members=minimum,
        timeout_s=timeout,
        topology=topology,
        job=job,
        exclusive_key=exclusive,
        jobset=group is None,
    )
