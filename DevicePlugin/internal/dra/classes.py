"""The DeviceClasses of DRA mode (resource.k8s.io/v1), one set per protocol.

Each class selects our driver's devices by the attributes the slice publisher writes
(slices.py), and serves one form of request:

- `<kind>.<driver>` (per kind of the device-kind table): a whole device. The request asks
  for no capacity; on a TDM-mode device it consumes every core and all memory, so nothing
  else shares it. With extended resources, `spec.extendedResourceName` is the kind's
  whole-device resource, so a pod asking e.g. `alibabacloud.com/gpu: 1` without a claim is
  served by this class (DRAExtendedResource).
- `<kind>-share.<driver>` (per sliceable kind): a TDM slice. The request asks for capacity
  `cores` (percent) and/or `memory` (bytes) of one TDM-mode device.
- `mig.<driver>`: a MIG instance. The request chooses the profile with a selector on the
  `profile` attribute, e.g. `device.attributes["dra.lingjun.com"].profile == "1g.10gb"`.
- `mig-<profile>.<driver>` (with extended resources, per listed MIG profile): a MIG
  instance of that profile, its `spec.extendedResourceName` the profile's device-plugin
  resource, so a pod asking e.g. `alibabacloud.com/mig-1g.10gb: 1` without a claim gets one
  instance of it. A profile not listed has no class: its pods need a claim.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import Any

from lj_runtimekit.deviceplugin.internal.dra.slices import (
    API_VERSION,
    MIG_TYPE,
    MODE,
    PROFILE,
    TDM_MODE,
    TYPE,
)
from lj_runtimekit.proto.pkg.devicekind import kinds
from lj_runtimekit.proto.pkg.protocol import Protocol, check_mig_profiles

PART_OF = "lj-runtimekit"


def _attribute(driver: str, name: str) -> str:
    return f"device.attributes[{json.dumps(driver)}].{name}"


def _selector(driver: str, **attributes: str) -> str:
    terms = [f"device.driver == {json.dumps(driver)}"]
    terms += [f"{_attribute(driver, k)} == {json.dumps(v)}" for k, v in attributes.items()]
    return " && ".join(terms)


def _device_class(name: str, expression: str, extended_resource: str | None) -> dict[str, Any]:
    spec: dict[str, Any] = {"selectors": [{"cel": {"expression": expression}}]}
    if extended_resource is not None:
        spec["extendedResourceName"] = extended_resource
    return {
        "apiVersion": API_VERSION,
        "kind": "DeviceClass",
        "metadata": {"name": name, "labels": {"app.kubernetes.io/part-of": PART_OF}},
        "spec": spec,
    }


def profile_selector(protocol: Protocol, profile: str) -> str:
    """The CEL a request of the MIG class uses to ask for one profile."""
    return f"{_attribute(protocol.dra.driver, PROFILE)} == {json.dumps(profile)}"


def device_classes(
    protocol: Protocol, *, extended_resources: bool, mig_profiles: Iterable[str] = ()
) -> list[dict[str, Any]]:
    """Every DeviceClass of the protocol's driver: whole device per kind, TDM share per
    sliceable kind, MIG instance; `extended_resources` names each kind's whole-device
    resource in its class and adds a class per MIG profile of `mig_profiles` naming the
    profile's resource (needs the DRAExtendedResource gate). A ValueError names a bad
    profile, or says `mig_profiles` needs `extended_resources`."""
    profiles = check_mig_profiles(mig_profiles)
    if profiles and not extended_resources:
        raise ValueError("MIG profile classes name extended resources: only with those on")
    driver = protocol.dra.driver
    classes = [
        _device_class(
            protocol.dra.whole_class(kind.name),
            _selector(driver, **{TYPE: kind.name}),
            kind.resource(protocol.resources) if extended_resources else None,
        )
        for kind in kinds()
    ]
    classes += [
        _device_class(
            protocol.dra.share_class(kind.name),
            _selector(driver, **{TYPE: kind.name, MODE: TDM_MODE}),
            None,
        )
        for kind in kinds()
        if kind.shareable
    ]
    mig = _selector(driver, **{TYPE: MIG_TYPE})
    classes.append(_device_class(protocol.dra.mig_class, mig, None))
    classes += [
        _device_class(
            protocol.dra.mig_profile_class(profile),
            _selector(driver, **{TYPE: MIG_TYPE, PROFILE: profile}),
            protocol.resources.mig(profile),
        )
        for profile in profiles
    ]
    return classes
