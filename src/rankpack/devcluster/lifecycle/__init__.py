"""The dev cluster's life: `rankpack dev-cluster up|down|status|stop-node|start-node|
load-image`, and a control-plane component restarted (fault tests).

Called by `rankpack.cli.devcluster_cmd` and by the `k8s` test tier's fixtures
(`tests/k8s/conftest.py`). Built on the pieces of `rankpack.devcluster` (its layout,
configs, pki, host, processes, images and rbac modules).

Modules:

- `preflight`: what a command checks first: root, the state directory's lock, and for `up`
  the machine (packages, another cluster, ports);
- `clusterstate`: what `up` recorded and what runs; `status`;
- `probes`: bounded waits and the health checks they poll; the admin's REST client;
- `nodes`: each node's containerd (in its mount namespace) and kubelet started, crashed;
  `stop_node`, `start_node`;
- `bringup`: `up` (`UpOptions`, `UpResult`);
- `teardown`: `down` (`DownReport`) and `leftovers`;
- `restarts`: `stop_component`, `start_component`;
- `loadimage`: `load-image` (a user's image archive into every node, its names read
  bounded).
"""
