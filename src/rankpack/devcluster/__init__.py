"""A real Kubernetes of one or more nodes on this machine: `rankpack dev-cluster
up [--nodes N]|down|status|stop-node|start-node`.

For users who want to try the Kubernetes backend without a cluster, and for the `k8s`
test tier (`tests/k8s/conftest.py`). Called by `rankpack.cli.devcluster_cmd`.

Modules, in the order `up` uses them:

- `layout`: state directory paths, the nodes (`NodeSpec`: name, address, ports, bridge,
  subnet, CPUs, cgroup root), image names (pure values);
- `packages`: the Debian packages it needs and which are missing;
- `binaries`: Kubernetes built from the Go module proxy, cached by version;
- `configs`: pure builders of argv lists, config files and kubeconfigs;
- `pki`: certificates, keys and static tokens;
- `images`: the pause and host-/usr images, built with umoci, imported with ctr;
- `processes`: detached daemons with pid files;
- `host`: what the cluster changes on the host (addresses, routes, cgroups, each node's
  mount namespace), recorded and undone;
- `rbac`: the backend's ServiceAccount/Role/RoleBinding (= ``deploy/``) and its kubeconfig;
- `cluster`: `up`, `down`, `status`, `stop_node`, `start_node`.

Beside `up`: `appimages` builds rankpack's own container images (``rankpack/rankpack`` and
``rankpack/rank``) from the checkout's ``images/`` with mmdebstrap and umoci, cached; what
they are made of (keys, config, the mmdebstrap command) is `imagerecipe`, pure.
"""
