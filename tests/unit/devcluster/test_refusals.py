"""`rankpack dev-cluster` refuses, in one line with exit code 2, when it cannot run."""

from __future__ import annotations

import socket

import pytest

from rankpack.devcluster import packages
from rankpack.devcluster.lifecycle import preflight


def test_a_taken_port_is_named() -> None:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", 10259))
        except OSError:
            pytest.skip("port 10259 is in use (a dev cluster is up)")
        s.listen()
        assert "10259 (kube-scheduler)" in preflight.ports_taken()


def test_missing_packages_hint_names_the_install_command() -> None:
    hint = packages.install_hint(["umoci", "etcd-server"])
    assert "umoci etcd-server" in hint and "apt-get install umoci etcd-server" in hint
    assert "\n" not in hint
    assert set(packages.REQUIRED) >= {
        "containerd",
        "runc",
        "containernetworking-plugins",
        "etcd-server",
        "busybox-static",
        "umoci",
    }
