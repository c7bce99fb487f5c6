"""The operator's edits of the plain YAML under deploy/<component>/: what deploy applies.

The files are rendered from manifests.py with the default options (`lj-deploy generate`).
An operator may edit one (an image, a resource limit, a ConfigMap setting) and deploy:
each field the edit changed is set on what deploy renders with its options, unless an
option sets that field too (the option wins, and a warning says so). An edited container
image counts as `--image`, so what is rendered from it (the Controller's Job Agent image
in its admission policy) follows. The protocol has one source, deploy/protocol.yaml: an
edit of the `protocol.yaml` key of one component's ConfigMap is refused, as is an added,
removed or renamed object (deploy applies its own objects, the files say their fields).
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from lj_runtimekit.deploy.components import (
    CHECKSUM_ANNOTATION,
    COMPONENTS,
    DRA_PLUGIN,
    Component,
    DeployError,
)
from lj_runtimekit.deploy.generate import kustomizations
from lj_runtimekit.deploy.manifests import (
    Obj,
    Options,
    common_files,
    component_files,
    config_checksum,
    default_options,
    dra_files,
)
from lj_runtimekit.proto.pkg.protocol.constants import parse_protocol

PROTOCOL_KEY = "protocol.yaml"
CONFIGMAP_FILE = "02-configmap.yaml"
JOB_IMAGE_ARG = "--job-image="
_MISSING = object()
"""A key a document does not have (an edit that adds or removes it)."""

Step = str | int


@dataclass(frozen=True)
class Edit:
    """One field of one object that the operator's file changed."""

    file: str
    """The file as shown, e.g. deploy/deviceplugin/03-daemonset.yaml."""
    obj: str
    """`Kind name` of the object."""
    path: tuple[Step, ...]
    value: Any
    """The edited value; `_MISSING`: the key was removed."""

    def where(self) -> str:
        out = ""
        for step in self.path:
            out += f"[{step}]" if isinstance(step, int) else (f".{step}" if out else step)
        return f"{self.file}: {self.obj} {out}"


def _show(value: Any) -> str:
    if value is _MISSING:
        return "(removed)"
    text = json.dumps(value, separators=(",", ":"), ensure_ascii=False)
    return text if len(text) <= 160 else text[:157] + "..."


def _diff(base: Any, edited: Any, path: tuple[Step, ...]) -> Iterator[tuple[tuple[Step, ...], Any]]:
    """The paths where `edited` differs from `base`, with the edited value. Maps are compared
    key by key, lists of equal length item by item; a list whose length changed is one value."""
    if isinstance(base, dict) and isinstance(edited, dict):
        for key in [*base, *(k for k in edited if k not in base)]:
            yield from _diff(base.get(key, _MISSING), edited.get(key, _MISSING), (*path, key))
    elif isinstance(base, list) and isinstance(edited, list) and len(base) == len(edited):
        for i, (a, b) in enumerate(zip(base, edited, strict=True)):
            yield from _diff(a, b, (*path, i))
    elif base != edited:
        yield path, edited


def _same_along(base: Any, other: Any, path: tuple[Step, ...]) -> bool:
    """`other` has the structure of `base` along `path` (lists of the same length) and the
    same value at its end: the options did not touch that field."""
    for step in path:
        if isinstance(base, list) and isinstance(other, list):
            if len(base) != len(other):
                return False
            base, other = base[step], other[step]  # type: ignore[index]
        elif isinstance(base, dict) and isinstance(other, dict):
            base, other = base.get(step, _MISSING), other.get(step, _MISSING)
        else:
            return bool(base == other)
    return bool(base == other)


def _set(obj: Any, path: tuple[Step, ...], value: Any) -> None:
    for step in path[:-1]:
        obj = obj[step]
    if value is _MISSING:
        obj.pop(path[-1], None)
    else:
        obj[path[-1]] = value


def _name(doc: Obj) -> str:
    return f"{doc.get('kind')} {(doc.get('metadata') or {}).get('name')}"


def _read(path: Path, shown: str) -> list[Obj]:
    if not path.is_file():
        raise DeployError(
            f"{shown} is missing; deploy applies the files under deploy/ with your edits:"
            f" restore it (git checkout -- {shown}, or make -C deploy manifests)"
        )
    try:
        docs = [d for d in yaml.safe_load_all(path.read_text()) if d is not None]
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        at = f" at line {mark.line + 1}" if mark else ""
        raise DeployError(f"{shown}: not valid YAML{at}: {getattr(exc, 'problem', exc)}") from exc
    if not all(isinstance(d, dict) for d in docs):
        raise DeployError(f"{shown}: every document must be a Kubernetes object (a mapping)")
    return docs


def _rendered_protocol(deploy_dir: Path, source: str) -> str:
    """The protocol.yaml the files were rendered from: the one their ConfigMaps hold.

    The ConfigMaps' files agreeing with each other but not with deploy/protocol.yaml were
    rendered before it changed (deploy renders from deploy/protocol.yaml); a file that
    disagrees with the others was edited, which the one source does not allow."""
    texts: dict[str, str] = {}
    for component in COMPONENTS:
        shown = f"{deploy_dir.name}/{component.directory}/{CONFIGMAP_FILE}"
        for doc in _read(deploy_dir / component.directory / CONFIGMAP_FILE, shown):
            data = doc.get("data") or {}
            if doc.get("kind") == "ConfigMap" and PROTOCOL_KEY in data:
                texts[shown] = str(data[PROTOCOL_KEY])
    if len(set(texts.values())) > 1:
        differ = [f for f, text in texts.items() if text != source]
        raise DeployError(
            f"{', '.join(differ)}: key {PROTOCOL_KEY} differs from"
            f" {deploy_dir.name}/protocol.yaml, the one source of the components' protocol;"
            f" fix: make the change in {deploy_dir.name}/protocol.yaml (deploy renders it into"
            " every ConfigMap and the workloads) and restore the file(s)"
            " (git checkout -- FILE, or make -C deploy manifests)"
        )
    text = next(iter(texts.values()), source)
    try:
        parse_protocol(yaml.safe_load(text), ", ".join(texts))
    except yaml.YAMLError as exc:
        raise DeployError(f"{', '.join(texts)}: key {PROTOCOL_KEY} is not valid YAML") from exc
    return text


def _image_key(component: Component, path: tuple[Step, ...], doc: Obj, value: Any) -> str | None:
    """The `--image` key an edit of a workload's container image (or of the Controller's
    Job Agent image argument) sets; None for any other edit."""
    if doc.get("kind") not in ("DaemonSet", "Deployment") or not isinstance(value, str):
        return None
    head = ("spec", "template", "spec", "containers")
    if path[:4] != head or len(path) < 6 or not isinstance(path[4], int):
        return None
    container = doc["spec"]["template"]["spec"]["containers"][path[4]]
    if container.get("name") != component.name:
        return None
    if path[5:] == ("image",):
        return component.images[0].key
    if path[5] == "args" and value.startswith(JOB_IMAGE_ARG) and len(component.images) > 1:
        return component.images[1].key
    return None


Files = dict[str, list[Obj]]


def _checksums(files: dict[str, Files], components: tuple[Component, ...]) -> None:
    """Each workload's config checksum from its ConfigMap as deploy applies it."""
    for component in components:
        docs = files[component.directory]
        data = next(d.get("data") or {} for d in docs[CONFIGMAP_FILE] if d["kind"] == "ConfigMap")
        for doc in docs[component.workload_file]:
            if doc["kind"] == component.kind:
                annotations = doc["spec"]["template"]["metadata"].setdefault("annotations", {})
                annotations[CHECKSUM_ANNOTATION] = config_checksum(data)


def _files(component: Component | None, opts: Options) -> Files:
    """The files of a component, of DRA mode (DRA_PLUGIN) or the common ones (None)."""
    if component is None:
        return common_files(opts)
    if component is DRA_PLUGIN:
        return dra_files(opts)
    return component_files(component, opts)


def _base_options(deploy_dir: Path, opts: Options) -> Options:
    """The options the files were rendered with: the defaults and their protocol."""
    return dataclasses.replace(
        default_options(deploy_dir),
        protocol_text=_rendered_protocol(deploy_dir, opts.protocol_text),
    )


def apply_edits(
    components: tuple[Component, ...], opts: Options, deploy_dir: Path, *, common: bool = True
) -> tuple[list[Obj], list[str]]:
    """Every object of `components` (in `manifests.render`'s order) rendered with `opts` and the
    operator's edits of the files under `deploy_dir`; and a line per edit, applied or
    overridden by an option."""
    base_opts = _base_options(deploy_dir, opts)
    dirs: list[tuple[str, Component | None]] = [("common", None)] if common else []
    dirs += [(c.directory, c) for c in components]
    rendered = components
    if opts.dra:
        dirs.append((DRA_PLUGIN.directory, DRA_PLUGIN))
        rendered = (*components, DRA_PLUGIN)

    def files_of(options: Options) -> dict[str, Files]:
        return {d: _files(c, options) for d, c in dirs}

    base, flagged = files_of(base_opts), files_of(opts)
    edits: list[tuple[str, str, int, Edit]] = []
    lines: list[str] = []
    images: dict[str, str] = {}
    for directory, component in dirs:
        for name, base_docs in base[directory].items():
            shown = f"{deploy_dir.name}/{directory}/{name}"
            edited = _read(deploy_dir / directory / name, shown)
            if [_name(d) for d in edited] != [_name(d) for d in base_docs]:
                raise DeployError(
                    f"{shown}: holds {', '.join(map(_name, edited)) or 'nothing'}, deploy"
                    f" renders {', '.join(map(_name, base_docs))}; deploy applies edits to the"
                    " fields of its objects, not added, removed or renamed objects; fix: restore"
                    f" the objects (git checkout -- {shown}) and apply your own with kubectl"
                )
            targets = flagged[directory].get(name)
            for index, (base_doc, doc) in enumerate(zip(base_docs, edited, strict=True)):
                for path, value in _diff(base_doc, doc, ()):
                    edit = Edit(shown, _name(doc), path, value)
                    target = targets[index] if targets else _MISSING
                    if not _same_along(base_doc, target, path):
                        now = (
                            "leave this object out"
                            if target is _MISSING
                            else f"set it ({_show(_at(target, path))})"
                        )
                        lines.append(
                            f"warning: {edit.where()}: your edit {_show(value)} is not applied:"
                            f" the options {now}"
                        )
                        continue
                    key = _image_key(component, path, doc, value) if component else None
                    if key and key not in opts.images:
                        images[key] = value.removeprefix(JOB_IMAGE_ARG)
                    edits.append((directory, name, index, edit))
                    lines.append(f"applying your edit of {edit.where()} = {_show(value)}")
    final = files_of(dataclasses.replace(opts, images={**opts.images, **images}))
    for directory, name, index, edit in edits:
        _set(final[directory][name][index], edit.path, edit.value)
    if edits:
        _checksums(final, rendered)
    lines += _unread(components, base_opts, deploy_dir)
    objs = [doc for _, files in final.items() for docs in files.values() for doc in docs]
    return objs, lines


def _at(obj: Any, path: tuple[Step, ...]) -> Any:
    for step in path:
        if isinstance(obj, dict):
            obj = obj.get(step, _MISSING)
        elif isinstance(obj, list) and isinstance(step, int) and step < len(obj):
            obj = obj[step]
        else:
            return _MISSING
    return obj


def _unread(components: tuple[Component, ...], base_opts: Options, deploy_dir: Path) -> list[str]:
    """A warning for each YAML file in the components' directories that deploy does not apply:
    a file of the operator's, or a kustomization that differs from the generated one."""
    generated = kustomizations(deploy_dir, base_opts)
    lines = []
    for component in components:
        names = set(component_files(component, base_opts))
        for path in sorted((deploy_dir / component.directory).glob("*.y*ml")):
            if path.name in names or generated.get(path) == path.read_text():
                continue
            shown = f"{deploy_dir.name}/{component.directory}/{path.name}"
            how = "kubectl apply -k" if path.name == "kustomization.yaml" else "kubectl apply -f"
            lines.append(
                f"warning: {shown} is not applied by deploy-all.sh ({how} reads it); deploy"
                f" applies {', '.join(sorted(names))} with your edits, and its options"
                " (--image=, --registry=, ...)"
            )
    return lines
