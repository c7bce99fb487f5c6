"""Series label names: this exporter's own or dcgm-exporter's, plus opt-in pod labels.

`--dcgm-label-names` renames the labels that have a dcgm-exporter counterpart
(`node` -> `Hostname`, `device` -> `gpu`, `uuid` -> `UUID`, `model` ->
`modelName`, `mig_profile` -> `GPU_I_PROFILE`, `mig_instance_id` -> `GPU_I_ID`;
`pci_bus_id`, `namespace`, `pod`, `container` are the same already), so
dashboards written for dcgm-exporter's labels select these series unchanged.
`--pod-labels` copies allow-listed pod labels onto the container series as
`label_<key>` (kube-state-metrics' naming: every character outside
[a-zA-Z0-9_] becomes `_`); `--pod-uid-label` adds `pod_uid`.
"""

from __future__ import annotations

import argparse
import re
from collections.abc import Iterable
from dataclasses import dataclass

from lj_runtimekit.exporter.internal.pods.model import Pod

DCGM_NAMES = {
    "node": "Hostname",
    "device": "gpu",
    "uuid": "UUID",
    "model": "modelName",
    "mig_profile": "GPU_I_PROFILE",
    "mig_instance_id": "GPU_I_ID",
}
"""This exporter's label -> dcgm-exporter's name for the same thing."""
POD_UID_LABEL = "pod_uid"
_NOT_IN_NAME = re.compile(r"[^a-zA-Z0-9_]")
_LABEL_KEY = re.compile(
    r"^([a-z0-9]([-a-z0-9.]*[a-z0-9])?/)?[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$"
)


def pod_label_name(key: str) -> str:
    """The series label of a pod label key: `label_` + the key with [^a-zA-Z0-9_] as `_`."""
    return "label_" + _NOT_IN_NAME.sub("_", key)


def pod_label_allowlist(text: str) -> tuple[tuple[str, str], ...]:
    """Parse `--pod-labels` (comma-separated pod label keys) into (key, series label) pairs;
    argparse.ArgumentTypeError for a key that is not one or two keys with the same label."""
    pairs: dict[str, str] = {}
    for raw in text.split(","):
        key = raw.strip()
        if not key:
            continue
        if not _LABEL_KEY.match(key) or len(key.rpartition("/")[2]) > 63:
            raise argparse.ArgumentTypeError(f"{key!r} is not a Kubernetes label key")
        name = pod_label_name(key)
        for other, other_name in pairs.items():
            if other_name == name and other != key:
                raise argparse.ArgumentTypeError(
                    f"{other!r} and {key!r} would both be the series label {name!r}"
                )
        pairs[key] = name
    return tuple(pairs.items())


@dataclass(frozen=True)
class LabelConfig:
    """Which label names the series carry."""

    dcgm_names: bool = False
    pod_labels: tuple[tuple[str, str], ...] = ()
    """(pod label key, series label name), from pod_label_allowlist."""
    pod_uid: bool = False

    def names(self, labels: Iterable[str]) -> list[str]:
        """`labels` as the series name them (dcgm-exporter's names when asked for)."""
        if not self.dcgm_names:
            return list(labels)
        return [DCGM_NAMES.get(label, label) for label in labels]

    def pod_label_names(self) -> list[str]:
        """The extra labels of a container series: pod labels, then `pod_uid`."""
        extra = [name for _, name in self.pod_labels]
        return [*extra, POD_UID_LABEL] if self.pod_uid else extra

    def pod_values(self, pod: Pod) -> list[str]:
        """The values of pod_label_names for `pod` (empty for a label the pod lacks)."""
        values = [pod.labels.get(key, "") for key, _ in self.pod_labels]
        return [*values, pod.uid] if self.pod_uid else values
