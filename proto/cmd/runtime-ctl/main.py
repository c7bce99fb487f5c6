"""`lj-runtime-ctl`: show a Runtime's version, devices, allocations and metrics.

The node's feature switch is the Controller's service: `lj-job-agent state` shows it.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys

from google.protobuf import json_format

from lj_runtimekit.proto.lingjun.runtime.v1 import runtime_pb2 as pb
from lj_runtimekit.proto.pkg.runtimeclient import (
    DEFAULT_SOCKET_DIR,
    RetryPolicy,
    RuntimeCallError,
    RuntimeClient,
    RuntimeUnavailableError,
)
from lj_runtimekit.proto.pkg.version import InvalidVersionError


def _mode(device: pb.Device) -> str:
    return pb.DeviceMode.Name(device.mode).removeprefix("DEVICE_MODE_").lower()


def _device_rows(devices: list[pb.Device]) -> list[list[str]]:
    rows = [["INDEX", "ID", "KIND", "MODEL", "MEMORY", "NUMA", "MODE", "HEALTH", "MIG"]]
    for d in devices:
        rows.append(
            [
                str(d.index),
                d.id,
                pb.DeviceKind.Name(d.kind).removeprefix("DEVICE_KIND_"),
                d.model,
                f"{d.memory_bytes / 2**30:.0f}Gi",
                str(d.numa_node),
                _mode(d),
                pb.Health.Name(d.health).removeprefix("HEALTH_").lower(),
                ",".join(m.profile for m in d.mig_instances) or "-",
            ]
        )
    return rows


def _table(rows: list[list[str]]) -> str:
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return "\n".join(
        "  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)) for row in rows
    )


async def _run(args: argparse.Namespace) -> str:
    retry = RetryPolicy(attempts=args.attempts)
    async with RuntimeClient(args.socket_dir, retry=retry) as client:
        if args.command == "info":
            info = await client.runtime_info()
            return (
                json_format.MessageToJson(info)
                if args.json
                else (
                    f"Runtime {info.version} on node {info.node_name or '-'}"
                    f" (api {info.api_version or '-'});"
                    f" capabilities: {', '.join(info.capabilities)}"
                )
            )
        if args.command == "devices":
            devices = await client.list_devices()
            if args.json:
                return json_format.MessageToJson(pb.ListDevicesResponse(devices=devices))
            return _table(_device_rows(devices))
        if args.command == "allocations":
            allocations = await client.list_allocations()
            return json_format.MessageToJson(pb.ListAllocationsResponse(allocations=allocations))
        return json_format.MessageToJson(await client.device_metrics())


def main(argv: list[str] | None = None) -> int:
    """Entry point of `lj-runtime-ctl`."""
    parser = argparse.ArgumentParser(prog="lj-runtime-ctl", description=__doc__)
    parser.add_argument(
        "--socket-dir",
        default=os.environ.get("LJ_RUNTIME_SOCKET_DIR", DEFAULT_SOCKET_DIR),
        help="directory of the Runtime socket (env LJ_RUNTIME_SOCKET_DIR)",
    )
    parser.add_argument("--attempts", type=int, default=3, help="attempts while unavailable")
    parser.add_argument("--json", action="store_true", help="print JSON")
    parser.add_argument("command", choices=["info", "devices", "allocations", "metrics"])
    args = parser.parse_args(argv)
    try:
        print(asyncio.run(_run(args)))
    except (RuntimeUnavailableError, RuntimeCallError, InvalidVersionError) as exc:
        print(f"lj-runtime-ctl: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
