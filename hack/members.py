"""Print the workspace members: `--dirs` (default) or `--names` (distribution names)."""

from __future__ import annotations

import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def main() -> int:
    """Print one member per line."""
    members = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["uv"]["workspace"][
        "members"
    ]
    for member in members:
        if "--names" in sys.argv:
            print(tomllib.loads((ROOT / member / "pyproject.toml").read_text())["project"]["name"])
        else:
            print(member)
    return 0


if __name__ == "__main__":
    sys.exit(main())
