"""`lj-deploy`: the helper that deploy/deploy-all.sh calls (rendering and checks).

Operators use deploy-all.sh; this command is its typed, tested core. Every
operator mistake prints one `error: ...` line saying what to fix and exits 1.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import yaml

from lj_runtimekit.deploy import dracheck, edits, manifests, verify
from lj_runtimekit.deploy.components import (
    BY_NAME,
    DEFAULT_JOBS_NAMESPACE,
    DEFAULT_NAMESPACE,
    DEFAULT_REGISTRY,
    DRA_PLUGIN,
    DeployError,
    check_jobs_namespace,
    check_namespace,
    check_registry,
    check_version,
    parse_components,
    parse_image_overrides,
)
from lj_runtimekit.proto.pkg.protocol import (
    KNOWN_MIG_PROFILES,
    ProtocolError,
    load_protocol,
    parse_protocol_text,
)

MIN_JOBSET_VERSION = "v0.8.0"


def _load_json(path: str) -> Any:
    try:
        return json.loads(Path(path).read_text())
    except (OSError, ValueError) as exc:
        raise DeployError(f"cannot read {path}: {exc}") from exc


def _items(path: str) -> list[dict[str, Any]]:
    data = _load_json(path)
    items: list[dict[str, Any]] = data.get("items", []) if isinstance(data, dict) else []
    return items


def _protocol_text(path: str) -> str:
    load_protocol(path)  # validates: names the key and the file
    return Path(path).read_text()


def _print_report(report: verify.Report) -> int:
    for line in report.ok:
        print(f"ok      {line}")
    for line in report.info:
        print(f"info    {line}")
    for line in report.problems:
        print(f"PROBLEM {line}")
    return 1 if report.problems else 0


def _options(args: argparse.Namespace) -> manifests.Options:
    return manifests.Options(
        protocol_text=_protocol_text(args.protocol),
        version=check_version(args.version),
        namespace=check_namespace(args.namespace),
        registry=check_registry(args.registry),
        images=parse_image_overrides(args.image or []),
        jobs_namespace=check_jobs_namespace(args.jobs_namespace),
        kubelet_pods_url="" if args.no_kubelet_read_only_port else manifests.KUBELET_PODS_URL,
        admission_policies=not args.no_admission_policies,
        extender=args.extender,
        extender_tls_secret=args.extender_tls_secret,
        extender_client_ca_secret=args.extender_client_ca_secret,
        extender_token_secret=args.extender_token_secret,
        dra=args.dra,
        dra_extended_resources=_dra_extended_resources(args),
        dra_mig_profiles=_dra_mig_profiles(args),
    )


def _dra_extended_resources(args: argparse.Namespace) -> bool:
    if args.dra_extended_resources and not args.dra:
        raise DeployError("--dra-extended-resources: only with --dra (DRA mode)")
    return bool(args.dra_extended_resources)


def _dra_mig_profiles(args: argparse.Namespace) -> tuple[str, ...]:
    """--dra-mig-profiles P1,P2,... (empty: none), or the default list."""
    if args.dra_mig_profiles is None:
        return KNOWN_MIG_PROFILES
    if not args.dra_extended_resources:
        raise DeployError(
            f"--dra-mig-profiles={args.dra_mig_profiles}: only with --dra-extended-resources"
        )
    return tuple(args.dra_mig_profiles.split(",")) if args.dra_mig_profiles else ()


def cmd_preflight(args: argparse.Namespace) -> int:
    """Check every option by rendering once; print what deploy-all.sh needs, one per line.

    `enable-label <key>`, `exporter-port <port>`, `scheduler-port <port>`,
    `jobset required <min>|not-required`, `device-api-label <key>`, `dra-driver <driver>`,
    with --dra `dra-plugin <resource>`,
    and per component `component <name> <kind> <workload> <resource> <configmap> <app>`.
    """
    components = parse_components(args.components)
    opts = _options(args)
    if args.deploy_dir:
        edits.apply_edits(components, opts, Path(args.deploy_dir))
    else:
        manifests.render(components, opts)
    print("enable-label", opts.protocol.labels.enable)
    print("exporter-port", manifests.METRICS_PORT)
    print("scheduler-port", manifests.SCHEDULER_METRICS_PORT)
    if manifests.jobset_required(manifests.scheduler_config()):
        print("jobset required", MIN_JOBSET_VERSION)
    else:
        print("jobset not-required")
    print("device-api-label", opts.protocol.labels.device_api)
    print("dra-driver", opts.protocol.dra.driver)
    if opts.dra:
        print("dra-plugin", DRA_PLUGIN.resource)
    for c in components:
        print("component", c.name, c.kind, c.workload, c.resource, c.configmap, c.app)
    return 0


def _in_namespace(obj: manifests.Obj, namespace: str) -> bool:
    """`obj` is the Namespace `namespace` or an object in it."""
    meta = obj["metadata"]
    if obj["kind"] == "Namespace":
        return bool(meta["name"] == namespace)
    return bool(meta.get("namespace") == namespace)


def _live_protocol_text(live: list[dict[str, Any]], keep: list[str], namespace: str) -> str | None:
    """The protocol.yaml of the kept ConfigMaps (None when none holds one); a DeployError
    when they disagree."""
    texts: dict[str, str] = {
        verify._name(cm): (cm.get("data") or {})[verify.PROTOCOL_KEY]
        for cm in live
        if verify._name(cm) in keep and verify.PROTOCOL_KEY in (cm.get("data") or {})
    }
    if not texts:
        return None
    protocols: dict[str, Any] = {}
    for name, text in texts.items():
        where = f"ConfigMap {namespace}/{name} key {verify.PROTOCOL_KEY}"
        protocols[name] = parse_protocol_text(text, where)
    if verify.agreed_protocol(protocols) is None:
        raise DeployError(
            f"--keep-live-config: the live ConfigMaps {', '.join(sorted(texts))} hold different"
            f" protocols; fix: give them the same {verify.PROTOCOL_KEY}"
            f" (kubectl -n {namespace} edit configmap ...), or deploy with --overwrite-config"
        )
    return next(iter(texts.values()))


def cmd_render(args: argparse.Namespace) -> int:
    """Render the manifests with the operator's options."""
    components = parse_components(args.components)
    opts = _options(args)
    keep = [n for n in (args.keep or "").split(",") if n]
    live = _items(args.keep_live_config) if args.keep_live_config else []
    if keep:
        text = _live_protocol_text(live, keep, opts.namespace)
        if text is not None:
            opts = dataclasses.replace(opts, protocol_text=text)
    common = not (args.no_common or args.workloads_only)
    if args.deploy_dir:
        objs, lines = edits.apply_edits(components, opts, Path(args.deploy_dir), common=common)
        for line in lines:
            print(line, file=sys.stderr if args.output == "-" else sys.stdout)
    else:
        objs = manifests.render(components, opts, common=common)
    if args.workloads_only:
        objs = [o for o in objs if o["kind"] in ("DaemonSet", "Deployment")]
    if keep:
        objs = verify.keep_live_config(objs, live, keep)
    if args.leave_out_namespace:
        objs = [o for o in objs if not _in_namespace(o, args.leave_out_namespace)]
    if args.only_namespace:
        objs = [o for o in objs if _in_namespace(o, args.only_namespace)]
    text = manifests.dump(objs)
    if args.output == "-":
        sys.stdout.write(text)
    else:
        Path(args.output).write_text(text)
    return 0


def _metrics(directory: str | None) -> dict[str, str]:
    """Pod name -> the /metrics answer read into `directory` as `<pod>.txt`."""
    if not directory:
        return {}
    return {p.stem: p.read_text() for p in sorted(Path(directory).glob("*.txt"))}


def cmd_verify(args: argparse.Namespace) -> int:
    components = parse_components(args.components)
    source = load_protocol(args.protocol)
    snap = Path(args.snapshot)
    report = verify.Report()
    workloads = _items(str(snap / "workloads.json"))
    pods = _items(str(snap / "pods.json"))
    nodes = _items(str(snap / "nodes.json"))
    configmaps = _items(str(snap / "configmaps.json"))
    # What runs is the live ConfigMaps' protocol (every one present, chosen or not), not the
    # source's: an operator may have edited them.
    present = [BY_NAME[n] for n in verify.PROTOCOL_COMPONENTS]
    live = verify.agreed_protocol(verify.live_protocols(configmaps, present, args.namespace)[0])
    protocol = live or source
    report.extend(
        verify.check_workloads(components, workloads, pods, args.namespace, protocol.labels.enable)
    )
    if any(c.name == "device-plugin" for c in components):
        report.extend(verify.check_nodes(nodes, protocol))
    report.extend(verify.stale_report(nodes, protocol))
    with_protocol = [c for c in components if c.name in verify.PROTOCOL_COMPONENTS]
    report.extend(
        verify.check_configmaps(
            configmaps, source, args.protocol_name, with_protocol, args.namespace
        )
    )
    metrics = _metrics(args.metrics_dir)
    running, named = verify.check_running_protocol(
        with_protocol, workloads, configmaps, pods, nodes, metrics, args.namespace
    )
    report.extend(running)
    report.extend(
        verify.check_rolled_config(components, workloads, configmaps, pods, args.namespace, named)
    )
    if live is not None:
        report.extend(verify.check_baked(components, workloads, live, args.namespace))
    if args.dra:
        opts = manifests.Options(protocol_text=Path(args.protocol).read_text(), version="v0.0.0")
        want = [c["metadata"]["name"] for c in manifests.device_classes(opts)]
        report.extend(
            verify.check_dra(
                workloads,
                pods,
                nodes,
                _items(str(snap / "deviceclasses.json")),
                _items(str(snap / "resourceslices.json")),
                want,
                protocol,
                args.namespace,
                metrics=metrics,
                now=datetime.now(UTC),
            )
        )
    return _print_report(report)


def cmd_status(args: argparse.Namespace) -> int:
    components = parse_components(args.components)
    snap = Path(args.snapshot)
    if args.dra:
        components = (*components, DRA_PLUGIN)
    lines = verify.status_lines(
        components, _items(str(snap / "workloads.json")), _items(str(snap / "pods.json"))
    )
    print("\n".join(lines))
    return 0


def cmd_stale(args: argparse.Namespace) -> int:
    """Print `<node> <json patch>` per node that carries stale protocol resources."""
    patches = verify.cleanup_patches(_items(args.nodes), load_protocol(args.protocol))
    for node, ops in sorted(patches.items()):
        print(node, json.dumps(ops, separators=(",", ":")))
    return 0


def cmd_config_save(args: argparse.Namespace) -> int:
    """Print `<configmap> <merge patch>` recording the live data before a change."""
    rendered: list[dict[str, Any]] = []
    if args.manifests:
        try:
            rendered = [d for d in yaml.safe_load_all(Path(args.manifests).read_text()) if d]
        except (OSError, yaml.YAMLError) as exc:
            raise DeployError(f"cannot read {args.manifests}: {exc}") from exc
    components = parse_components(args.components)
    configmaps = _items(args.configmaps)
    running = verify.running_checksums(components, _items(args.workloads))
    ran = verify.running_edits(configmaps, _items(args.pods), components) if args.pods else set()
    patches = verify.save_previous_config(configmaps, args.names.split(","), rendered, running, ran)
    for name, patch in sorted(patches.items()):
        print(name, json.dumps(patch, separators=(",", ":")))
    return 0


def cmd_config_edits(args: argparse.Namespace) -> int:
    """Print the ConfigMaps edited since the last deploy that it would replace: a line of
    their names (comma-separated), then one describing each and the keys; nothing if none."""
    try:
        rendered = [d for d in yaml.safe_load_all(Path(args.manifests).read_text()) if d]
    except (OSError, yaml.YAMLError) as exc:
        raise DeployError(f"cannot read {args.manifests}: {exc}") from exc
    edited = verify.edited_configs(
        _items(args.configmaps),
        _items(args.workloads),
        rendered,
        parse_components(args.components),
    )
    if edited:
        print(",".join(sorted(edited)))
        print(
            ", ".join(
                f"ConfigMap {args.namespace}/{name} (keys {', '.join(keys)})"
                for name, keys in sorted(edited.items())
            )
        )
    return 0


def cmd_fetch_metrics(args: argparse.Namespace) -> int:
    """Save the answer of an http(s) metrics URL to a file; one error line when it fails."""
    if not args.url.startswith(("http://", "https://")):
        raise DeployError(f"--metrics-url={args.url}: expected an http:// or https:// URL")
    import urllib.request

    try:
        with urllib.request.urlopen(args.url, timeout=10) as answer:  # noqa: S310
            Path(args.output).write_bytes(answer.read())
    except OSError as exc:
        raise DeployError(f"--metrics-url={args.url}: no answer ({exc})") from exc
    return 0


def cmd_config_restore(args: argparse.Namespace) -> int:
    """Print `<configmap> <current checksum> <restored checksum> <merge patch>`."""
    restores = verify.restore_previous_config(_items(args.configmaps), args.names.split(","))
    for name, (patch, current, previous) in sorted(restores.items()):
        print(name, current[:12], previous[:12], json.dumps(patch, separators=(",", ":")))
    return 0


def cmd_node_keys(args: argparse.Namespace) -> int:
    """Print `<node> <merge patch>` per node carrying the Runtime Kit's labels/annotations."""
    patches = verify.node_key_patches(_items(args.nodes), load_protocol(args.protocol))
    for node, patch in sorted(patches.items()):
        print(node, json.dumps(patch, separators=(",", ":")))
    return 0


def cmd_check_metrics(args: argparse.Namespace) -> int:
    if args.url:
        if not args.url.startswith(("http://", "https://")):
            raise DeployError(f"--metrics-url={args.url}: expected an http:// or https:// URL")
        import urllib.request

        try:
            with urllib.request.urlopen(args.url, timeout=10) as answer:  # noqa: S310
                text = answer.read().decode("utf-8", "replace")
        except OSError as exc:
            print(f"PROBLEM exporter {args.url}: no answer ({exc}); fix: check the URL")
            return 1
        return _print_report(verify.check_metrics(text, args.url))
    if not args.file:
        raise DeployError("check-metrics: give a FILE or --url")
    return _print_report(verify.check_metrics(Path(args.file).read_text(), args.where))


def cmd_dra_probe(args: argparse.Namespace) -> int:
    """Print the objects precheck creates (server-side dry run) to probe the DRA gates."""
    probe = dracheck.probe_objects(load_protocol(args.protocol), args.server_minor)
    sys.stdout.write(manifests.dump(probe))
    return 0


def cmd_dra_gates(args: argparse.Namespace) -> int:
    """Print the DRA feature gates whose fields the dry run of `dra-probe` dropped."""
    try:
        returned = dracheck.returned_objects(Path(args.returned).read_text())
    except (OSError, ValueError) as exc:
        raise DeployError(f"cannot read {args.returned}: {exc}") from exc
    missing = dracheck.missing_gates(returned)
    if missing:
        print(" ".join(missing))
    return 0


def cmd_generate(args: argparse.Namespace) -> int:
    from lj_runtimekit.deploy import generate

    stale = generate.generate(Path(args.deploy_dir), check=args.check)
    root = Path(args.deploy_dir).resolve().parent
    for path in stale:
        shown = path.resolve().relative_to(root)
        print(f"{'stale' if args.check else 'wrote'} {shown}")
    if args.check and stale:
        print("error: generated deploy files are stale; run: make -C deploy manifests")
        return 1
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="lj-deploy", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)

    for name, func in (("render", cmd_render), ("preflight", cmd_preflight)):
        p = sub.add_parser(name, help=(func.__doc__ or "").splitlines()[0])
        p.add_argument("--protocol", required=True, help="deploy/protocol.yaml")
        p.add_argument("--components", default="")
        p.add_argument("--namespace", default=DEFAULT_NAMESPACE)
        p.add_argument("--registry", default=DEFAULT_REGISTRY)
        p.add_argument("--version", required=True)
        p.add_argument("--image", action="append", help="<component>=<image reference>")
        p.add_argument("--jobs-namespace", default=DEFAULT_JOBS_NAMESPACE)
        p.add_argument(
            "--no-kubelet-read-only-port",
            action="store_true",
            help="the node agents watch their node's pods on the API server instead",
        )
        p.add_argument(
            "--no-admission-policies",
            action="store_true",
            help="leave out the ValidatingAdmissionPolicies (Kubernetes < 1.30)",
        )
        p.add_argument(
            "--extender",
            action="store_true",
            help="the scheduler as an extender of the kube-scheduler (TLS, a Service, the"
            " kube-scheduler configuration)",
        )
        p.add_argument("--extender-tls-secret", default="", metavar="NAME", help="tls.crt, tls.key")
        p.add_argument(
            "--extender-client-ca-secret", default="", metavar="NAME", help="ca.crt of callers"
        )
        p.add_argument("--extender-token-secret", default="", metavar="NAME", help="token")
        p.add_argument(
            "--dra",
            action="store_true",
            help="DRA mode (Kubernetes >= 1.34): the DRA kubelet plugin and its DeviceClasses",
        )
        p.add_argument(
            "--dra-extended-resources",
            action="store_true",
            help="the whole-device DeviceClasses name their extended resource"
            " (DRAExtendedResource)",
        )
        p.add_argument(
            "--dra-mig-profiles",
            metavar="P1,P2,...",
            help="with --dra-extended-resources: the MIG profiles whose DeviceClass names"
            " <mig prefix>/mig-<profile> (empty: none; default NVIDIA's profiles of A30,"
            " A100, H100, H200)",
        )
        p.add_argument(
            "--deploy-dir",
            metavar="DIR",
            help="apply the operator's edits of the plain YAML under DIR/<component>/"
            " (deploy-all.sh: deploy/); the options win where both set a field",
        )
        p.set_defaults(func=func)
        if name == "render":
            p.add_argument("--no-common", action="store_true", help="leave out the RuntimeClass")
            p.add_argument("--workloads-only", action="store_true")
            p.add_argument(
                "--leave-out-namespace",
                metavar="NS",
                help="leave out namespace NS and the objects in it (a dry run before it exists)",
            )
            p.add_argument(
                "--only-namespace",
                metavar="NS",
                help="only the objects in namespace NS (delete beside another install)",
            )
            p.add_argument(
                "--keep-live-config",
                metavar="FILE",
                help="kubectl get configmaps -o json: the live ConfigMaps --keep names",
            )
            p.add_argument(
                "--keep",
                metavar="NAMES",
                help="ConfigMaps (comma-separated) whose live data is kept; the workloads are"
                " rendered with their protocol.yaml",
            )
            p.add_argument("-o", "--output", default="-")

    for name, func in (("verify", cmd_verify), ("status", cmd_status)):
        p = sub.add_parser(name, help=f"{name} report from a kubectl snapshot directory")
        p.add_argument("--snapshot", required=True)
        p.add_argument("--components", default="")
        p.add_argument("--namespace", default=DEFAULT_NAMESPACE)
        p.add_argument("--protocol", required=True)
        p.add_argument("--protocol-name", default="deploy/protocol.yaml")
        p.add_argument("--metrics-dir", help="verify: the pods' /metrics answers, <pod>.txt")
        p.add_argument(
            "--dra",
            action="store_true",
            help="DRA mode: the DRA plugin too (verify: deviceclasses.json and"
            " resourceslices.json in the snapshot)",
        )
        p.set_defaults(func=func)

    p = sub.add_parser("stale-patches", help="JSON patches removing stale node resources")
    p.add_argument("--nodes", required=True)
    p.add_argument("--protocol", required=True)
    p.set_defaults(func=cmd_stale)

    p = sub.add_parser("config-save", help=cmd_config_save.__doc__)
    p.add_argument("--configmaps", required=True, help="kubectl get configmaps -o json")
    p.add_argument("--names", required=True, help="the ConfigMaps, comma-separated")
    p.add_argument("--manifests", help="what deploy applies (none: an upgrade)")
    p.add_argument("--workloads", required=True, help="kubectl get daemonsets,deployments -o json")
    p.add_argument("--components", default="")
    p.add_argument(
        "--pods",
        help="kubectl get pods -o json: an edit their start shows they run is recorded too",
    )
    p.set_defaults(func=cmd_config_save)

    p = sub.add_parser("config-edits", help=(cmd_config_edits.__doc__ or "").splitlines()[0])
    p.add_argument("--configmaps", required=True, help="kubectl get configmaps -o json")
    p.add_argument("--workloads", required=True, help="kubectl get daemonsets,deployments -o json")
    p.add_argument("--manifests", required=True, help="what deploy applies")
    p.add_argument("--components", default="")
    p.add_argument("--namespace", default=DEFAULT_NAMESPACE)
    p.set_defaults(func=cmd_config_edits)

    p = sub.add_parser("fetch-metrics", help=cmd_fetch_metrics.__doc__)
    p.add_argument("--url", required=True)
    p.add_argument("-o", "--output", required=True)
    p.set_defaults(func=cmd_fetch_metrics)

    p = sub.add_parser("config-restore", help=cmd_config_restore.__doc__)
    p.add_argument("--configmaps", required=True, help="kubectl get configmaps -o json")
    p.add_argument("--names", required=True, help="the ConfigMaps, comma-separated")
    p.set_defaults(func=cmd_config_restore)

    p = sub.add_parser("node-keys", help=cmd_node_keys.__doc__)
    p.add_argument("--nodes", required=True)
    p.add_argument("--protocol", required=True)
    p.set_defaults(func=cmd_node_keys)

    p = sub.add_parser("check-metrics", help="the answer has # HELP/# TYPE lines")
    p.add_argument("file", nargs="?")
    p.add_argument("--where", default="metrics")
    p.add_argument("--url", help="fetch the metrics from this http(s) URL instead")
    p.set_defaults(func=cmd_check_metrics)

    p = sub.add_parser("dra-probe", help=cmd_dra_probe.__doc__)
    p.add_argument("--protocol", required=True)
    p.add_argument(
        "--server-minor", type=int, required=True, help="the API server's minor (37 for 1.37)"
    )
    p.set_defaults(func=cmd_dra_probe)

    p = sub.add_parser("dra-gates", help=cmd_dra_gates.__doc__)
    p.add_argument("--returned", required=True, help="kubectl create --dry-run=server -o json")
    p.set_defaults(func=cmd_dra_gates)

    p = sub.add_parser(
        "generate", help="write the plain YAML, kustomizations, Helm chart and Controller/config"
    )
    p.add_argument("--deploy-dir", required=True)
    p.add_argument("--check", action="store_true", help="only report stale files")
    p.set_defaults(func=cmd_generate)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        code: int = args.func(args)
    except (DeployError, ProtocolError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    return code


if __name__ == "__main__":
    sys.exit(main())
