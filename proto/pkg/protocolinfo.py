"""The protocol a component runs, as `deploy-all.sh verify` reads it back.

Each component that loads `protocol.yaml` reports the hash of what it loaded: the
Scheduler Framework and the Exporter as the metric `lj_runtimekit_protocol_info{sha256=...} 1`
on their /metrics, the Device Plugin (which has no metrics port) as the annotation
`lj-runtimekit.io/protocol-sha256` on its own Node. The hash is over the effective values
(every key, built-in defaults filled in), so a comment or the key order does not change it.
"""

from __future__ import annotations

import functools
import hashlib
import json
import logging
import re

from lj_runtimekit.proto.pkg.kube import (
    MERGE_PATCH,
    KubeClient,
    KubeError,
    RetryPolicy,
    call_async,
)
from lj_runtimekit.proto.pkg.protocol import Protocol

log = logging.getLogger(__name__)

METRIC = "lj_runtimekit_protocol_info"
METRIC_HELP = "The protocol.yaml this process loaded: 1, labelled with the sha256 of its values"
NODE_ANNOTATION = "lj-runtimekit.io/protocol-sha256"
"""On a Node: the hash of the protocol its Device Plugin loaded."""

_METRIC_RE = re.compile(
    rf'^{METRIC}\{{[^}}]*sha256="([0-9a-f]{{64}})"[^}}]*\}}\s+1(\.0)?\s*$', re.M
)


def protocol_sha256(protocol: Protocol) -> str:
    """The hex sha256 of the protocol's effective values (sorted compact JSON)."""
    text = json.dumps(protocol.as_flat(), sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()


def sha256_from_metrics(text: str) -> str | None:
    """The hash a /metrics answer reports, or None when it reports none."""
    match = _METRIC_RE.search(text)
    return match.group(1) if match else None


async def annotate_node(
    kube: KubeClient, node_name: str, protocol: Protocol, policy: RetryPolicy | None = None
) -> bool:
    """Write the protocol's hash on the Node (the Device Plugin's report); False (logged)
    when the API server refuses it."""
    patch = {"metadata": {"annotations": {NODE_ANNOTATION: protocol_sha256(protocol)}}}
    try:
        await call_async(
            f"annotate node {node_name} with the protocol hash",
            functools.partial(
                kube.request,
                "PATCH",
                f"/api/v1/nodes/{node_name}",
                patch,
                content_type=MERGE_PATCH,
            ),
            policy or RetryPolicy(attempts=5, timeout_s=30.0),
        )
    except KubeError as exc:
        log.warning(
            "protocol hash not written on the node",
            extra={"node": node_name, "reason": str(exc)},
        )
        return False
    return True
