"""`rankpack dev-cluster up|down|status|stop-node|start-node|images`: a real Kubernetes of one or
more nodes on this machine.

Thin layer over `rankpack.devcluster.lifecycle` (and `deploy`, `appimages`): parses
options, prints what happened. `register` adds one parser per action (`_add_up`, ...).
"""

from __future__ import annotations

import argparse
from pathlib import Path

from rankpack.cli.common import print_json
from rankpack.devcluster.binaries import CACHE_ROOT, DEFAULT_VERSION, KubeVersion
from rankpack.devcluster.layout import NAMESPACE, Layout, default_state_dir


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser(
        "dev-cluster",
        help="a real Kubernetes of one or more nodes on this machine (up, down, images, ...)",
        description=(
            "Stand up, inspect or remove a Kubernetes cluster of one or more nodes (kubelets "
            "splitting the CPUs) on this machine, "
            "for trying the Kubernetes backend and for the k8s test tier. Needs root and "
            "Debian's containerd, runc, containernetworking-plugins, etcd-server, "
            "busybox-static and umoci (bash setup.sh installs them). The Kubernetes "
            f"binaries are built once per version from the Go module proxy into {CACHE_ROOT} "
            "(about 10 minutes on 2 cores; later starts take seconds)."
        ),
    )
    p.add_argument(
        "--state-dir",
        type=Path,
        default=None,
        metavar="DIR",
        help=(
            "where the cluster keeps state, certificates and logs "
            "(default: $RANKPACK_DEV_CLUSTER_DIR or /var/lib/rankpack/dev-cluster)"
        ),
    )
    actions = p.add_subparsers(dest="action", metavar="ACTION", parser_class=type(p))
    actions.required = True
    for add in (_add_up, _add_down, _add_status, _add_stop_node, _add_start_node, _add_images,
                _add_load_image):  # fmt: skip
        add(actions)


def _add_up(actions: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    up = actions.add_parser(
        "up",
        help="start the cluster and wait until its node is Ready",
        description=(
            "Build or reuse the binaries, build the local images, start etcd, containerd, "
            "kube-apiserver, controller-manager, scheduler and kubelet, wait until the node "
            f"is Ready, create the namespace '{NAMESPACE}' with the backend's ServiceAccount, "
            "Role and RoleBinding, and write an admin kubeconfig and a kubeconfig for that "
            "ServiceAccount. If the cluster is already up, says so (and refreshes the "
            "ServiceAccount token)."
        ),
    )
    up.add_argument(
        "--version",
        default=DEFAULT_VERSION,
        help=f"Kubernetes release to run, >= v1.35 (default {DEFAULT_VERSION})",
    )
    up.add_argument(
        "--timeout",
        type=float,
        default=180.0,
        metavar="SECONDS",
        help="how long to wait for each start phase, e.g. node Ready (default 180)",
    )
    up.add_argument(
        "--nodes",
        type=int,
        default=1,
        metavar="N",
        help=(
            "how many nodes (kubelets), each with its own share of the CPUs (cores split "
            "evenly; at most one node per core) (default 1)"
        ),
    )
    up.add_argument(
        "--operator",
        action="store_true",
        help="also run rankpack in the cluster as a cluster admin would: build (or reuse) the "
        "rankpack and rank images from this checkout, import them, and apply deploy/dev "
        "(the operator Deployment and the node agent DaemonSet; kubectl apply -k), then wait "
        "until both are ready",
    )
    up.add_argument("--json", action="store_true", help="print the result as JSON")
    up.set_defaults(handler=run_up)


def _add_down(actions: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    down = actions.add_parser(
        "down",
        help="stop the cluster and remove everything it created",
        description=(
            "Stop the kubelet, the pods' containers and shims, containerd and the control "
            "plane; unmount what they mounted; remove the kubepods cgroups, the node address, "
            "the pod bridge and the fixed paths the cluster created; restore the sysctls; "
            "then check that nothing is left. Keeps the binary cache and the last logs."
        ),
    )
    down.add_argument("--json", action="store_true", help="print the result as JSON")
    down.set_defaults(handler=run_down)


def _add_status(actions: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    status = actions.add_parser(
        "status",
        help="is the cluster up and Ready; kubeconfig paths; nodes",
        description="Report the cluster's state. Exit code 0 when Ready, 1 otherwise.",
    )
    status.add_argument("--json", action="store_true", help="print the result as JSON")
    status.set_defaults(handler=run_status)


def _add_stop_node(actions: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    stop = actions.add_parser(
        "stop-node",
        help="crash one node: kill its kubelet, containerd and pods, take its pod network down",
        description=(
            "A node crash: SIGKILL to the node's kubelet, containerd, shims and every process "
            "of its pods; its mount namespace, pod network namespaces and bridge are removed. "
            "The Node object stays: the control plane sees the node stop answering."
        ),
    )
    stop.add_argument("name", metavar="NAME", help="the node (see `status`)")
    stop.add_argument("--json", action="store_true", help="print the result as JSON")
    stop.set_defaults(handler=run_stop_node)


def _add_start_node(actions: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    start = actions.add_parser(
        "start-node",
        help="bring a stopped node back, empty, and wait until it is Ready",
        description=(
            "Start a node `stop-node` stopped: its old containers, pod directories, IPAM and "
            "cgroups are removed first, then its containerd (with the images) and kubelet "
            "start and the node registers again. Pods the API still binds to it are the "
            "control plane's to deal with."
        ),
    )
    start.add_argument("name", metavar="NAME", help="the node (see `status`)")
    start.add_argument(
        "--timeout", type=float, default=180.0, metavar="SECONDS",
        help="how long to wait for the node to be Ready (default 180)",
    )  # fmt: skip
    start.add_argument("--json", action="store_true", help="print the result as JSON")
    start.set_defaults(handler=run_start_node)


def _add_images(actions: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    images = actions.add_parser(
        "images",
        help="build or reuse rankpack's container images (rankpack, rank)",
        description=(
            "Build rankpack.local/rankpack:dev (the operator and node agent) and "
            "rankpack.local/rank:dev (OpenFOAM, Open MPI, MPICH: rank and launcher pods) "
            "from this checkout with mmdebstrap and umoci, no container engine needed. "
            f"Cached under {CACHE_ROOT}/images: the Debian base of each (minutes) once per "
            "package list, rankpack's code layer (seconds) once per source change. Prints "
            "one line per image: reference, sizes, built or cached, archive path. Needs "
            "root, mmdebstrap and umoci; images/Containerfile builds the same elsewhere."
        ),
    )
    images.add_argument(
        "--source",
        type=Path,
        default=None,
        metavar="DIR",
        help="the rankpack checkout to build from (default: the one this rankpack runs from)",
    )
    images.add_argument("--json", action="store_true", help="print the result as JSON")
    images.set_defaults(handler=run_images)


def _add_load_image(actions: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    load = actions.add_parser(
        "load-image",
        help="put an image archive into every node (there is no registry), as kind load does",
        description=(
            "Import an image archive (docker save, podman save, ctr images export, or an OCI "
            "layout in a tar) into the containerd of every running node, under the names it "
            "carries, and keep it for nodes start-node brings back. A Simulation then names "
            "it in spec.image (allowed by the operator's --allow-image)."
        ),
    )
    load.add_argument("archive", type=Path, metavar="ARCHIVE", help="the image archive (a tar)")
    load.add_argument("--json", action="store_true", help="print the result as JSON")
    load.set_defaults(handler=run_load_image)


def _state_dir(args: argparse.Namespace) -> Path:
    explicit: Path | None = args.state_dir
    return explicit if explicit is not None else default_state_dir()


def run_up(args: argparse.Namespace) -> int:
    from rankpack.devcluster.lifecycle import bringup

    version = KubeVersion.parse(args.version)
    if args.timeout <= 0:
        from rankpack.errors import UserError

        raise UserError("--timeout must be a positive number of seconds")
    opts = bringup.UpOptions(
        version=version,
        state_dir=_state_dir(args),
        ready_timeout_s=args.timeout,
        nodes=args.nodes,
    )
    say = (lambda _msg: None) if args.json else print
    result = bringup.up(opts, say=say)
    operator: dict[str, object] | None = None
    if args.operator:
        from rankpack.devcluster import deploy

        done = deploy.deploy(Layout(opts.state_dir), version, args.timeout, say=say)
        operator = done.as_json()
    if args.json:
        print_json(
            {
                "already_up": result.already_up,
                "version": result.version,
                "kubeconfig": str(result.kubeconfig),
                "service_account_kubeconfig": str(result.service_account_kubeconfig),
                "state_dir": str(result.state_dir),
                "elapsed_s": round(result.elapsed_s, 2),
                "nodes": list(result.nodes),
                "operator": operator,
            }
        )
        return 0
    nodes = f"{len(result.nodes)} node{'s' if len(result.nodes) != 1 else ''}"
    if result.already_up:
        print(f"rankpack: the dev cluster {result.version} ({nodes}) is already up")
    else:
        print(
            f"rankpack: dev cluster {result.version} ({nodes}) is Ready in {result.elapsed_s:.1f} s"
        )
    print(f"  admin kubeconfig:          {result.kubeconfig}")
    print(f"  backend kubeconfig (RBAC): {result.service_account_kubeconfig}")
    print(f"  try: KUBECONFIG={result.kubeconfig} kubectl get nodes")
    if operator is not None:
        from rankpack.operator import manifests

        print(f"  operator and node agents running in namespace {manifests.SYSTEM_NAMESPACE} "
              f"(deploy/dev, {operator['elapsed_s']} s), its store and every namespace's "
              f"files in {operator['runs_dir']}")  # fmt: skip
        cases = manifests.tenant_path(NAMESPACE, "cases")
        print(f"  Simulations in namespace {NAMESPACE}: cases under {cases} (on this host "
              f"{operator['runs_dir']}/namespaces/{NAMESPACE}/cases)")  # fmt: skip
    return 0


def run_down(args: argparse.Namespace) -> int:
    from rankpack.devcluster.lifecycle import teardown
    from rankpack.errors import UserError

    report = teardown.down(_state_dir(args))
    if args.json:
        print_json(
            {
                "was_up": report.was_up,
                "stopped_pids": report.stopped_pids,
                "unmounted": report.unmounted,
                "removed_cgroups": report.removed_cgroups,
                "removed_paths": report.removed_paths,
                "leftovers": report.leftovers,
            }
        )
    elif not report.was_up and not report.stopped_pids and not report.leftovers:
        print("rankpack: no dev cluster is up; nothing to do")
    else:
        print(
            f"rankpack: dev cluster down: stopped {len(report.stopped_pids)} processes, "
            f"unmounted {report.unmounted} mounts, removed {len(report.removed_cgroups)} "
            f"cgroups and {len(report.removed_paths)} host paths"
        )
    if report.leftovers:
        raise UserError(
            "down left things behind: " + "; ".join(report.leftovers) + " (run it again)"
        )
    return 0


def run_status(args: argparse.Namespace) -> int:
    from rankpack.devcluster.lifecycle import clusterstate

    result = clusterstate.status(_state_dir(args))
    if args.json:
        print_json(result)
    elif not result["running"]:
        print("rankpack: no dev cluster is up (start one with `rankpack dev-cluster up`)")
    else:
        state = "Ready" if result["ready"] else "not Ready"
        print(f"rankpack: dev cluster {result['version']} is {state}")
        for node in result["nodes"]:
            ready = "Ready" if node["ready"] else "stopped" if node.get("stopped") else "NotReady"
            cpus = f", CPUs {node['cpus']}" if "cpus" in node else ""
            print(
                f"  node {node['name']}: {ready}{cpus}, allocatable "
                f"{node['allocatable_millis']}m CPU"
            )
        print(f"  kubeconfig: {result['kubeconfig']}")
        print(f"  backend kubeconfig: {result['service_account_kubeconfig']}")
        if "error" in result:
            print(f"  error: {result['error']}")
    return 0 if result["ready"] else 1


def run_stop_node(args: argparse.Namespace) -> int:
    from rankpack.devcluster.lifecycle import nodes

    stopped = nodes.stop_node(_state_dir(args), args.name)
    if args.json:
        print_json({"node": stopped.name, "killed_pids": stopped.killed_pids})
    else:
        print(
            f"rankpack: node {stopped.name} stopped ({len(stopped.killed_pids)} processes "
            "killed, its pod network removed)"
        )
    return 0


def run_start_node(args: argparse.Namespace) -> int:
    from rankpack.devcluster.lifecycle import nodes
    from rankpack.errors import UserError

    if args.timeout <= 0:
        raise UserError("--timeout must be a positive number of seconds")
    took = nodes.start_node(_state_dir(args), args.name, args.timeout)
    if args.json:
        print_json({"node": args.name, "was_running": took == 0.0, "elapsed_s": round(took, 2)})
    elif took == 0.0:
        print(f"rankpack: node {args.name} is already running")
    else:
        print(f"rankpack: node {args.name} is back and Ready in {took:.1f} s")
    return 0


def run_load_image(args: argparse.Namespace) -> int:
    from rankpack.devcluster.lifecycle import loadimage

    done = loadimage.load(_state_dir(args), args.archive)
    if args.json:
        print_json({"images": list(done.refs), "nodes": list(done.nodes),
                    "elapsed_s": round(done.seconds, 2)})  # fmt: skip
    else:
        print(f"rankpack: {', '.join(done.refs)} loaded into {len(done.nodes)} node(s) "
              f"({', '.join(done.nodes)}) in {done.seconds:.1f} s")  # fmt: skip
    return 0


def run_images(args: argparse.Namespace) -> int:
    from rankpack.devcluster import appimages

    root = appimages.find_source_root(args.source)
    result = appimages.ensure_images(root, say=(lambda _msg: None) if args.json else print)
    appimages.print_result(result, args.json)
    return 0
