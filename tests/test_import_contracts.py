"""The import contracts (hack/import_contracts.py): what the checker reads, and the tree."""

from __future__ import annotations

import importlib
from pathlib import Path
from types import ModuleType

import pytest

HACK = Path(__file__).resolve().parent.parent / "hack"


@pytest.fixture
def contracts(monkeypatch: pytest.MonkeyPatch) -> ModuleType:
    monkeypatch.syspath_prepend(str(HACK))
    return importlib.import_module("import_contracts")


def test_run_time_imports_are_read_type_checking_ones_are_not(
    contracts: ModuleType, tmp_path: Path
) -> None:
    source = tmp_path / "__init__.py"
    source.write_text(
        "from typing import TYPE_CHECKING\n"
        "from . import sibling\n"
        "from .sub import thing\n"
        "import lj_runtimekit.controller.internal\n"
        "if TYPE_CHECKING:\n"
        "    from lj_runtimekit.sandbox import Sandbox\n"
        "def late() -> None:\n"
        "    from lj_runtimekit.envtest import ControlPlane\n"
    )
    got = contracts.imports(source, "lj_runtimekit.exporter.internal")
    assert got == {
        "lj_runtimekit.exporter.internal",
        "lj_runtimekit.exporter.internal.sibling",
        "lj_runtimekit.exporter.internal.sub",
        "lj_runtimekit.exporter.internal.sub.thing",
        "lj_runtimekit.controller.internal",
        "lj_runtimekit.envtest",
        "lj_runtimekit.envtest.ControlPlane",
    }


def test_the_tree_breaks_no_contract_beyond_the_known_exceptions(contracts: ModuleType) -> None:
    found = set(contracts.violations())
    assert found == set(contracts.KNOWN), {
        "new": sorted(found - set(contracts.KNOWN)),
        "gone": sorted(set(contracts.KNOWN) - found),
    }


def test_the_shared_package_importing_a_component_is_caught(
    contracts: ModuleType, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    shared = tmp_path / "shared.py"
    shared.write_text("from lj_runtimekit.controller.pkg import featureclient\n")
    component = tmp_path / "featureclient.py"
    component.write_text("")
    sources = [
        ("lj_runtimekit.proto.pkg.shared", shared, True),
        ("lj_runtimekit.controller.pkg.featureclient", component, True),
    ]
    monkeypatch.setattr(contracts, "sources", lambda: iter(sources))
    assert contracts.violations() == [
        "shared module lj_runtimekit.proto.pkg.shared imports a component:"
        " lj_runtimekit.controller.pkg.featureclient"
    ]


def test_production_importing_test_tooling_is_caught_and_tooling_may_import_anything(
    contracts: ModuleType, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    plugin = tmp_path / "plugin.py"
    plugin.write_text("from lj_runtimekit.testkit.waits import wait_for\n")
    waits = tmp_path / "waits.py"
    waits.write_text("")
    simulator = tmp_path / "sim.py"
    simulator.write_text(
        "from lj_runtimekit.testkit import waits\n"
        "from lj_runtimekit.deviceplugin.internal.plugin import plugin\n"
    )
    sources = [
        ("lj_runtimekit.deviceplugin.internal.plugin.plugin", plugin, True),
        ("lj_runtimekit.testkit.waits", waits, False),
        ("lj_runtimekit.runtimesim.server", simulator, False),
    ]
    monkeypatch.setattr(contracts, "sources", lambda: iter(sources))
    assert contracts.violations() == [
        "production module lj_runtimekit.deviceplugin.internal.plugin.plugin imports test"
        " tooling lj_runtimekit.testkit.waits"
    ]
