"""The kubelet's `GET /pods`, read by every component that needs the node's pods."""

from lj_runtimekit.proto.pkg.kubeletpods.reader import (
    DEFAULT_KUBELET_PODS_URL,
    KubeletPodsError,
    KubeletPodsReader,
    check_pods_url,
)

__all__ = ["DEFAULT_KUBELET_PODS_URL", "KubeletPodsError", "KubeletPodsReader", "check_pods_url"]
