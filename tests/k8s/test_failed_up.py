"""A start that cannot finish is taken down again and names its log.

(That `down` leaves nothing behind is checked by the session's teardown, after the last
test that needs the cluster: `DevCluster.take_down` in tests/k8s/conftest.py.)"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from rankpack.devcluster import host
from rankpack.devcluster.layout import Layout
from tests.k8s.conftest import DevCluster


def test_a_failed_up_names_the_log_and_leaves_nothing(k8s_down: DevCluster) -> None:
    """A start that cannot finish (here: a 0.05 s budget per phase) is taken down again."""
    proc = subprocess.run(
        [sys.executable, "-m", "rankpack", "dev-cluster", "up", "--timeout", "0.05"],
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
    )
    assert proc.returncode == 2, proc.stdout + proc.stderr
    err = proc.stderr.strip()
    assert err.count("\n") == 0, err
    assert "timed out" in err and "/logs" in err, err
    assert "taking down what was started" in proc.stdout
    from rankpack.devcluster.lifecycle.clusterstate import running_components
    from rankpack.devcluster.lifecycle.teardown import leftovers

    layout = Layout(k8s_down.state_dir)
    assert running_components(layout) == {}
    assert leftovers(layout, k8s_down.before) == []
    assert not list(Path("/sys/fs/cgroup").glob("*/kubepods"))
    assert not host.cluster_cgroups()  # the nodes' cgroup roots, the daemons' cgroup
    assert not host.node_address_present()
