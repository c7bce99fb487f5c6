"""Check the workspace's import contracts from the source (run by `make lint`).

- Components are independent: the Device Plugin, Scheduler Framework, Exporter,
  Controller and deploy tooling import the shared contract package, never each other.
- The shared contract package (`proto`) imports no component: components depend on it,
  never the reverse.
- Production code never imports the test tooling: envtest, the test kit (doubles and
  helpers), the Runtime simulator, the sandbox. Test tooling may import anything.
- The Scheduler Framework is layered: plugins -> framework -> cache (a lower layer never
  imports a higher one).
- No import cycle between the packages of a member.

Imports under `if TYPE_CHECKING:` do not count (they never run). `KNOWN` lists the
violations that exist today, each with the reason; a new violation fails, and so does a
listed one that is gone (delete its line): the list only shrinks.
"""

from __future__ import annotations

import ast
import sys
from collections.abc import Iterator
from pathlib import Path

from typecheck import SKIP_DIRS, members, package_dirs

SHARED = "lj_runtimekit.proto"
COMPONENTS = (
    "lj_runtimekit.deviceplugin",
    "lj_runtimekit.schedulerframework",
    "lj_runtimekit.exporter",
    "lj_runtimekit.controller",
    "lj_runtimekit.deploy",
)
TOOLING = (
    "lj_runtimekit.envtest",
    "lj_runtimekit.testkit",
    "lj_runtimekit.runtimesim",
    "lj_runtimekit.sandbox",
)
SF = "lj_runtimekit.schedulerframework.internal."
LAYERS = (SF + "plugins", SF + "framework", SF + "cache")
"""Highest first: a module may import its own layer and the ones after it."""
NOT_PRODUCTION_DIRS = {"tests", "bench"}

KNOWN: dict[str, str] = {
    "lj_runtimekit.deploy.manifests imports another component: "
    "lj_runtimekit.schedulerframework.internal.config": (
        "deploy renders the scheduler's LjSchedulerConfiguration with the scheduler's own defaults"
    ),
    "lj_runtimekit.deploy.manifests imports another component: "
    "lj_runtimekit.schedulerframework.internal.config.config": "the same",
    "lj_runtimekit.deploy.manifests imports another component: "
    "lj_runtimekit.schedulerframework.internal.extender": (
        "the extender option renders the kube-scheduler's extender stanza with the scheduler's"
        " own generator (its managed resources from the protocol)"
    ),
    "lj_runtimekit.deploy.manifests imports another component: "
    "lj_runtimekit.schedulerframework.internal.extender.sample": "the same",
    "lj_runtimekit.deploy.manifests imports another component: "
    "lj_runtimekit.deviceplugin.internal.dra": (
        "deploy renders the DeviceClasses with the DRA plugin's own generator, from the same"
        " attributes the plugin publishes"
    ),
    "lj_runtimekit.deploy.manifests imports another component: "
    "lj_runtimekit.deviceplugin.internal.dra.classes": "the same",
    "lj_runtimekit.deploy.dracheck imports another component: "
    "lj_runtimekit.deviceplugin.internal.dra.slices": (
        "precheck's probe pool is laid out as the DRA plugin lays out its own for the"
        " server's Kubernetes minor"
    ),
}


def _name(path: Path, mapping: dict[str, Path]) -> str | None:
    """The import name of a source file, by the most specific package-dir mapping."""
    best: tuple[int, str] | None = None
    for name, directory in mapping.items():
        if path.is_relative_to(directory):
            depth = len(directory.parts)
            if best is None or depth > best[0]:
                rel = path.relative_to(directory).with_suffix("")
                parts = [p.replace("-", "_") for p in rel.parts]
                if parts[-1] == "__init__":
                    parts.pop()
                best = (depth, ".".join([name, *parts]))
    return best[1] if best else None


def sources() -> Iterator[tuple[str, Path, bool]]:
    """(module, file, production) for every Python file of every member."""
    for member in members():
        mapping = package_dirs(member)
        for path in sorted(member.rglob("*.py")):
            rel = path.relative_to(member).parts
            if any(p in SKIP_DIRS or p.startswith(".") for p in rel):
                continue
            module = _name(path.resolve(), mapping)
            if module is None:
                continue
            production = not (NOT_PRODUCTION_DIRS & set(rel[:-1])) and not module.startswith(
                TOOLING
            )
            yield module, path, production


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def imports(path: Path, module: str) -> set[str]:
    """The lj_runtimekit modules `path` imports at run time."""
    tree = ast.parse(path.read_text(), str(path))
    skipped = {
        id(n)
        for node in ast.walk(tree)
        if isinstance(node, ast.If) and _is_type_checking(node.test)
        for stmt in node.body
        for n in ast.walk(stmt)
    }
    is_package = path.name == "__init__.py"
    out: set[str] = set()
    for node in ast.walk(tree):
        if id(node) in skipped:
            continue
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = module.split(".")
                keep = len(parts) - node.level + (1 if is_package else 0)
                base = ".".join(parts[:keep] + ([base] if base else []))
            out.add(base)
            out |= {f"{base}.{a.name}" for a in node.names}
    return {m for m in out if m.startswith("lj_runtimekit.")}


def _under(module: str, prefixes: tuple[str, ...]) -> str | None:
    return next((p for p in prefixes if module == p or module.startswith(p + ".")), None)


def violations() -> list[str]:
    """Every broken contract, one line each."""
    found = list(sources())
    known_modules = {m for m, _, _ in found}
    packages = {m for m, path, _ in found if path.name == "__init__.py"}
    out: set[str] = set()
    edges: dict[str, set[str]] = {}
    for module, path, production in found:
        package = module if module in packages else module.rpartition(".")[0]
        for target in imports(path, module) & known_modules:
            target_package = target if target in packages else target.rpartition(".")[0]
            if target_package != package:
                edges.setdefault(package, set()).add(target_package)
            if not production:
                continue
            mine, theirs = _under(module, COMPONENTS), _under(target, COMPONENTS)
            if mine and theirs and mine != theirs:
                out.add(f"{module} imports another component: {target}")
            if theirs and _under(module, (SHARED,)):
                out.add(f"shared module {module} imports a component: {target}")
            if _under(target, TOOLING):
                out.add(f"production module {module} imports test tooling {target}")
            low, high = _under(module, LAYERS), _under(target, LAYERS)
            if low and high and LAYERS.index(high) < LAYERS.index(low):
                out.add(f"{module} ({low}) imports a higher layer: {target}")
    out |= _cycles(edges)
    return sorted(out)


def _cycles(edges: dict[str, set[str]]) -> set[str]:
    """A line per pair of packages of one member that import each other, directly or not."""
    reach: dict[str, set[str]] = {}

    def reachable(start: str) -> set[str]:
        if start not in reach:
            seen: set[str] = set()
            todo = [start]
            while todo:
                for nxt in edges.get(todo.pop(), ()):
                    if nxt not in seen:
                        seen.add(nxt)
                        todo.append(nxt)
            reach[start] = seen
        return reach[start]

    out = set()
    for a in edges:
        for b in edges[a]:
            if a < b and a in reachable(b) and not (b.startswith(a + ".") or a.startswith(b + ".")):
                out.add(f"cycle {a} <-> {b}")
    return out


def main() -> int:
    """Print the violations not in KNOWN and the KNOWN ones that are gone."""
    found = set(violations())
    new = sorted(found - KNOWN.keys())
    gone = sorted(KNOWN.keys() - found)
    for line in new:
        print(f"import contract broken: {line}")
    for line in gone:
        print(f"import contract exception no longer needed (remove it from KNOWN): {line}")
    if not new and not gone:
        print(f"import contracts hold ({len(KNOWN)} known exceptions)")
    return 1 if new or gone else 0


if __name__ == "__main__":
    sys.exit(main())
