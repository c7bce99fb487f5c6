"""A benchmark's part file (bench/parts/<component>[.<name>].json), merged into
bench/results.json by hack/bench_merge.py."""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any


def write_part(path: Path, results: Mapping[str, Any], component: str) -> None:
    """Merge `results` into the part file (its keys replace the file's; the file's other
    keys, from a run of another part of the benchmark, stay) and print them as
    `<component>.<key> <value>`."""
    path.parent.mkdir(parents=True, exist_ok=True)
    part = (json.loads(path.read_text()) if path.exists() else {}) | dict(results)
    path.write_text(json.dumps(dict(sorted(part.items())), indent=2) + "\n")
    for key, value in sorted(results.items()):
        shown = " ".join(str(x) for x in value) if isinstance(value, list) else value
        print(f"{component}.{key} {shown}")
