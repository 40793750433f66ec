"""A real Kubernetes of one or more nodes on this machine: `rankpack dev-cluster
up [--nodes N] [--operator]|down|status|stop-node|start-node|images`.

For users who want to try the Kubernetes backend without a cluster, and for the `k8s`
test tier (`tests/k8s/conftest.py`). Called by `rankpack.cli.devcluster_cmd`.

Modules, in the order `up` uses them:

- `layout`: state directory paths, the nodes (`NodeSpec`: name, address, ports, bridge,
  subnet, CPUs, cgroup root), image names (pure values);
- `packages`: the Debian packages it needs and which are missing;
- `binaries`: Kubernetes built from the Go module proxy, cached by version;
- `toolsbuild`: ``rankpack-tools`` (``tools/``, static Go) built with that Go into the
  package, for the images' code layer and launcher-pod simulations;
- `configs`: pure builders of argv lists, config files and kubeconfigs;
- `pki`: certificates, keys and static tokens;
- `images`: the pause and host-/usr images, built with umoci, imported with ctr;
- `processes`: detached daemons with pid files (started, found, stopped, reaped);
- `host`: what the cluster changes on the host (addresses, routes, cgroups, each node's
  mount namespace), recorded and undone;
- `relay`: the service relay, standing in for kube-proxy at the kubernetes Service's
  address (a daemon `up` starts);
- `rbac`: the backend's ServiceAccount/Role/RoleBinding (= ``deploy/``) and its kubeconfig;
- `lifecycle`: the commands built from those: `up` (`bringup`), `down` (`teardown`),
  `status` (`clusterstate`), `stop-node`/`start-node` (`nodes`), a control-plane component restarted
  (`restarts`), with `preflight` and `probes` (see its docstring).

Beside `up`:

- `deploy`: `up --operator`, rankpack itself in the cluster (``deploy/dev``);
- `appimages`: rankpack's own container images (``rankpack/rankpack`` and ``rankpack/rank``)
  from the checkout's ``images/``, cached; `applayers` builds their layers with mmdebstrap
  and umoci; what they are made of (keys, config, the mmdebstrap command) is
  `imagerecipe`, pure;
- `testimages`: the test images, Simulation images with nothing of rankpack (Debian 13's
  OpenFOAM with Open MPI 5, an MPICH program, a program without MPI), built the same way
  and cached beside them; what they are made of is `testrecipe`, pure;
- `nodefiles`: where a host process reads each node's rank pods' files (the CLI and tests
  on the dev cluster).
"""
