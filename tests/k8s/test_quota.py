"""A namespace ResourceQuota on CPU requests (issue 26, item 5), on the dev cluster: two
2-rank Simulations of 1000m each under a 1200m ``requests.cpu`` quota. Before, each got
its first rank pod, the second was refused and both ended Failed (LaunchFailed); now the
operator plans within the quota (reads it, holds or packs) and both succeed."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

from tests.k8s.operators import Env

QUOTA = "rankpack-test-cpu"


def test_no_simulation_fails_for_quota(env: Env, tmp_path: Path) -> None:
    from kubernetes import client

    core = client.CoreV1Api(env.k8s.admin_api())
    ns = env.k8s.namespace
    core.create_namespaced_resource_quota(
        ns, {"metadata": {"name": QUOTA}, "spec": {"hard": {"requests.cpu": "1200m"}}}
    )
    try:
        made = env.cli(
            "submit", "pitzDaily", "--backend", "kubernetes", "--ranks", "2", "--budget", "1",
            "--iterations", "150", "--count", "2", "--json",
        )  # fmt: skip
        assert made.returncode == 0, made.stderr
        op = env.operator("--until-idle", log=tmp_path / "op.log")
        assert op.wait(timeout=600) == 0, (tmp_path / "op.log").read_text()[-3000:]
        sims = env.simulations()
        assert [o["status"]["phase"] for o in sims] == ["Succeeded", "Succeeded"], [
            o["status"].get("result") for o in sims
        ]
        with sqlite3.connect(env.db) as conn:
            rows = conn.execute(
                "SELECT kind, detail_json FROM events WHERE kind IN ('launch-held', 'resize',"
                " 'launch', 'launch-failed')"
            ).fetchall()
        kinds = [k for k, _ in rows]
        assert "launch-failed" not in kinds
        held = [json.loads(d) for k, d in rows if k == "launch-held"]
        print(f"\nheld: {[(h.get('code'), h['reason'][:120]) for h in held]}")
        # the quota was read and planned within: a hold says so, or the pair was packed
        # into it (requests shrunk in place before the second launch)
        assert any(h.get("code") == "quota" for h in held) or "resize" in kinds, kinds
    finally:
        core.delete_namespaced_resource_quota(QUOTA, ns)
