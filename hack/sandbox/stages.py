"""KWOK pod stages of the sandbox: the envtest stages, with a pod becoming Running only
once its node's kubelet shim admitted it (Allocate done, Job Agent run).

A real kubelet starts containers only after the device manager's admission
(Allocate for every container); KWOK would make a bound pod Running at once.
The shim writes ADMITTED_ANNOTATION (its checkpoint of the device IDs it gave
each container) when admission succeeds, and fails the pod itself (phase
Failed, reason UnexpectedAdmissionError) when it does not.
"""

from __future__ import annotations

from typing import Any

import yaml

from lj_runtimekit.envtest.kwok import stages_text

ADMITTED_ANNOTATION = "sandbox.lj-runtimekit.io/admitted"
"""Set by the kubelet shim: JSON {container: {resource: [device IDs]}} it allocated."""


def sandbox_stages() -> str:
    """The envtest KWOK stages with `pod-ready` gated on ADMITTED_ANNOTATION."""
    docs: list[dict[str, Any]] = [d for d in yaml.safe_load_all(stages_text()) if d]
    for doc in docs:
        if doc.get("metadata", {}).get("name") == "pod-ready":
            doc["spec"]["selector"]["matchExpressions"].append(
                {"key": f'.metadata.annotations["{ADMITTED_ANNOTATION}"]', "operator": "Exists"}
            )
            break
    else:
        raise RuntimeError("the envtest KWOK stages have no pod-ready stage")
    return yaml.safe_dump_all(docs, sort_keys=False)
