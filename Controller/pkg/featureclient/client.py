"""Calls of the Runtime's node-feature switch (`NodeFeatureService`, the Controller's
interface in `api/proto/config_service.proto`) through the shared RuntimeClient: same
socket, channel, retry policy and errors as every other Runtime call.
"""

from __future__ import annotations

from lj_runtimekit.controller.pkg.configpb import config_service_pb2 as pb
from lj_runtimekit.controller.pkg.configpb import config_service_pb2_grpc as pb_grpc
from lj_runtimekit.proto.pkg.runtimeclient import RuntimeClient


async def enable_features(client: RuntimeClient, requester: str) -> pb.FeatureState:
    """Turn the node's features on (idempotent)."""
    return await client.call(
        "EnableFeatures",
        lambda channel: pb_grpc.NodeFeatureServiceStub(channel).EnableFeatures(
            pb.EnableFeaturesRequest(requester=requester), timeout=client.retry.call_timeout_s
        ),
    )


async def disable_features(client: RuntimeClient, requester: str) -> pb.FeatureState:
    """Turn the node's features off (idempotent)."""
    return await client.call(
        "DisableFeatures",
        lambda channel: pb_grpc.NodeFeatureServiceStub(channel).DisableFeatures(
            pb.DisableFeaturesRequest(requester=requester), timeout=client.retry.call_timeout_s
        ),
    )


async def feature_state(client: RuntimeClient) -> pb.FeatureState:
    """Whether the node's features are on, and who switched them last."""
    return await client.call(
        "GetFeatureState",
        lambda channel: pb_grpc.NodeFeatureServiceStub(channel).GetFeatureState(
            pb.GetFeatureStateRequest(), timeout=client.retry.call_timeout_s
        ),
    )
