"""Kubeconfig files for tests."""

from __future__ import annotations

from pathlib import Path

UNREACHABLE = (
    "apiVersion: v1\nkind: Config\ncurrent-context: c\n"
    "clusters: [{name: c, cluster: {server: 'https://127.0.0.1:1'}}]\n"
    "users: [{name: u, user: {token: t}}]\n"
    "contexts: [{name: c, context: {cluster: c, user: u}}]\n"
)


def unreachable_kubeconfig(directory: Path) -> Path:
    """`<directory>/kubeconfig`: a valid kubeconfig (token user) whose API server never
    answers (port 1 on loopback)."""
    path = directory / "kubeconfig"
    path.write_text(UNREACHABLE)
    return path
