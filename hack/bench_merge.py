"""Merge bench/parts/*.json into bench/results.json and print a table with targets.

Each part is one component's flat object of numbers (bench/README.md); a part named
`<component>.<name>.json` adds its keys to that component's (a key in two parts is an
error). The result adds "env" (machine, versions, date).
"""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
from datetime import UTC, datetime
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PARTS = ROOT / "bench" / "parts"
RESULTS = ROOT / "bench" / "results.json"

REQUIRED = {
    "deviceplugin": [
        "allocate_p50_ms",
        "allocate_p99_ms",
        "list_and_watch_first_ms",
        "health_to_kubelet_ms",
        "kubelet_restart_reregister_ms",
    ],
    "scheduler": [
        "whole_gpu_pods_per_s",
        "kube_scheduler_whole_gpu_pods_per_s",
        "whole_gpu_ratio_vs_kube_scheduler",
        "share_pods_per_s",
        "filter_score_p50_ms",
        "filter_score_p99_ms",
        "gang_256_place_s",
        "overcommit_violations",
        "partial_gangs",
    ],
    "exporter": ["scrape_p50_ms", "scrape_p99_ms", "rss_mb"],
    "controller": ["label_500_nodes_done_s", "duplicate_jobs", "rss_mb"],
    "controlplane": ["cold_build_s", "warm_start_s", "kwok_1000_nodes_s"],
    "deploy": ["cold_image_build_s"],
    "dra": [
        "prepare_p50_ms",
        "prepare_p99_ms",
        "plugin_rss_mb",
        "churn_pods",
        "churn_device_conflicts",
        "churn_ledger_mismatches",
        "burst_200_running_s",
        "burst_ratio_vs_device_plugin",
    ],
}

# (component, key) -> (comparison, bound) as the issues state them.
TARGETS = {
    ("deviceplugin", "allocate_p99_ms"): ("<=", 5.0),
    ("deviceplugin", "health_to_kubelet_ms"): ("<=", 1000.0),
    ("deviceplugin", "kubelet_restart_reregister_ms"): ("<=", 2000.0),
    ("scheduler", "whole_gpu_ratio_vs_kube_scheduler"): (">=", 1.0),
    ("scheduler", "filter_score_p99_ms"): ("<=", 10.0),
    ("scheduler", "overcommit_violations"): ("==", 0.0),
    ("scheduler", "gang_256_place_s"): ("<=", 5.0),
    ("scheduler", "partial_gangs"): ("==", 0.0),
    ("scheduler", "whole_gpu_ratio_matched_work"): (">=", 1.0),
    ("scheduler", "n5000_whole_gpu_ratio_vs_kube_scheduler"): (">=", 1.0),
    ("scheduler", "n5000_filter_score_p99_ms"): ("<=", 10.0),
    ("scheduler", "slice_gang_placed"): ("==", 1.0),
    ("exporter", "scrape_p99_ms"): ("<=", 25.0),
    ("exporter", "rss_mb"): ("<=", 80.0),
    ("exporter", "apiserver_requests_per_min_per_node"): ("<=", 1.0),
    ("controller", "label_500_nodes_done_s"): ("<=", 60.0),
    ("controller", "duplicate_jobs"): ("==", 0.0),
    ("controller", "rss_mb"): ("<=", 100.0),
    ("controller", "skewed_leader_takeovers"): ("==", 0.0),
    ("dra", "prepare_p99_ms"): ("<=", 20.0),
    ("dra", "plugin_rss_mb"): ("<=", 80.0),
    ("dra", "churn_pods"): (">=", 500.0),
    ("dra", "churn_device_conflicts"): ("==", 0.0),
    ("dra", "churn_ledger_mismatches"): ("==", 0.0),
    ("dra", "scheduler_ratio_vs_kube_scheduler"): (">=", 1.0),
    ("dra", "gang_256_place_s"): ("<=", 5.0),
    ("dra", "partial_gangs"): ("==", 0.0),
    ("dra", "overcommit_violations"): ("==", 0.0),
    ("dra", "lj_churn_overcommit_violations"): ("==", 0.0),
    ("dra", "lj_churn_ledger_mismatches"): ("==", 0.0),
    ("kueue", "partial_workloads"): ("==", 0.0),
    ("e2e", "churn_device_conflicts"): ("==", 0.0),
    ("e2e", "churn_ledger_mismatches"): ("==", 0.0),
    ("e2e", "churn_foreign_specs"): ("==", 0.0),
}


def _meets(value: float, comparison: str, bound: float) -> bool:
    if comparison == "<=":
        return value <= bound
    if comparison == ">=":
        return value >= bound
    return value == bound


def _env() -> dict[str, str]:
    versions = {}
    env_file = ROOT / "hack" / "versions.env"
    if env_file.exists():
        for line in env_file.read_text().splitlines():
            key, sep, value = line.partition("=")
            if sep and not key.startswith("#"):
                versions[key.strip().lower()] = value.strip().strip('"')
    rev = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=False,
    ).stdout.strip()
    return {
        "machine": f"{platform.machine()} {os.cpu_count()} cores {platform.system()}",
        "python": platform.python_version(),
        "runtimekit_version": (ROOT / "VERSION").read_text().strip(),
        "git_revision": rev,
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        **versions,
    }


def main() -> int:
    """Merge the parts; exit 1 when a required key is missing."""
    results: dict[str, object] = {}
    for part in sorted(PARTS.glob("*.json")):
        component = part.stem.split(".")[0]
        data = results.setdefault(component, {})
        assert isinstance(data, dict)
        added = json.loads(part.read_text())
        twice = sorted(set(data) & set(added))
        if twice:
            print(f"{part.name}: keys already in {component}: {', '.join(twice)}", file=sys.stderr)
            return 1
        data.update(added)
    results["env"] = _env()
    RESULTS.write_text(json.dumps(results, indent=2, sort_keys=True) + "\n")
    missing = []
    print(f"{'benchmark':52} {'value':>12}  target")
    for component, data in sorted(results.items()):
        if component == "env" or not isinstance(data, dict):
            continue
        for key, value in sorted(data.items()):
            comparison, bound = TARGETS.get((component, key), ("", 0.0))
            target = ""
            if comparison:
                verdict = "ok" if _meets(float(value), comparison, bound) else "MISSED"
                target = f"{comparison} {bound:g}  {verdict}"
            if isinstance(value, list):  # per-round values beside their median
                print(f"{component + '.' + key:52} {' '.join(f'{v:.3g}' for v in value)}")
                continue
            print(f"{component + '.' + key:52} {value:>12.4g}  {target}")
    for component, keys in REQUIRED.items():
        data = results.get(component)
        for key in keys:
            if not isinstance(data, dict) or key not in data:
                missing.append(f"{component}.{key}")
    print(f"wrote {RESULTS.relative_to(ROOT)}")
    if missing:
        print(f"missing benchmark keys: {', '.join(missing)}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
