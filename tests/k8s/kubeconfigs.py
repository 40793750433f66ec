"""A user's kubeconfig in the k8s tier: the admin's cluster and CA, a ServiceAccount's token."""

from __future__ import annotations

from pathlib import Path

import yaml


def token_kubeconfig(admin: Path, token: str, namespace: str, path: Path) -> Path:
    """``path`` written (0600): ``admin``'s kubeconfig with ``token`` as its user and
    ``namespace`` as its contexts' namespace."""
    config = yaml.safe_load(admin.read_text())
    for user in config["users"]:
        user["user"] = {"token": token}
    for context in config["contexts"]:
        context["context"]["namespace"] = namespace
    path.write_text(yaml.safe_dump(config))
    path.chmod(0o600)
    return path
