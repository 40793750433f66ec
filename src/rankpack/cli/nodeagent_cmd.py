"""`rankpack node-agent`: serve this node's rank pods' readings (decision 0010)."""

from __future__ import annotations

import argparse
import logging
import os
import signal
import threading
from pathlib import Path

from rankpack.backend.protocol import BackendError
from rankpack.errors import UserError


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser(
        "node-agent",
        help="serve this node's rank pods' CPU counters and shim records (a DaemonSet)",
        description=(
            "The node agent: one per node (deploy it as a DaemonSet with "
            "`python -m rankpack.nodeagent.manifests`). It follows the rank pods on its node "
            "through a watch on the API, reads their cgroups' CPU counters and pressure and "
            "the PMPI shim's live records in each pod's own volume (through the kubelet's "
            "pods directory), and serves them on the pod network: GET /v1/ranks?namespace=NS, PUT "
            "/v1/namespaces/NS/simulations/SIM/wait-mode, PUT /v1/namespaces/NS/pods/POD/nices "
            "(a group pod's ranks' nice values), GET /metrics, GET /healthz. "
            "Requests carry a ServiceAccount token, checked by TokenReview and "
            "SubjectAccessReview (ranks.rankpack.dev: get, update)."
        ),
    )
    p.add_argument("--node", default=os.environ.get("NODE_NAME"),
                   help="this node's name (default: $NODE_NAME)")  # fmt: skip
    p.add_argument("--port", type=int, default=8475, help="port to listen on (8475)")
    p.add_argument("--address", default="0.0.0.0", help="address to listen on (all)")
    p.add_argument("--kubelet-root", type=Path, default=Path("/var/lib/kubelet"),
                   help="the kubelet's root directory (/var/lib/kubelet)")  # fmt: skip
    p.add_argument("--cgroup-root", type=Path, default=Path("/sys/fs/cgroup"),
                   help="where the node's cgroups are mounted (/sys/fs/cgroup)")  # fmt: skip
    p.add_argument("--pods-cgroup", default="auto",
                   help="the node's pods cgroup below the cgroup root, e.g. kubepods; auto "
                   "(default): the one this agent's own pod sits in (/proc/self/cgroup), "
                   "else kubepods")  # fmt: skip
    p.add_argument("--kubeconfig", help="kubeconfig file (default: the pod's ServiceAccount)")
    p.set_defaults(handler=handle_node_agent)


def handle_node_agent(args: argparse.Namespace) -> int:
    from rankpack.backend.kubernetes.api.client import ClientKubeApi
    from rankpack.backend.kubernetes.api.config import KubernetesConfig
    from rankpack.backend.kubernetes.api.informer import Cache, core
    from rankpack.backend.kubernetes.api.kubeapi import ApiError
    from rankpack.backend.kubernetes.nodes.nodereader import NodeReader, resolve_pods_cgroup
    from rankpack.nodeagent.auth import ApiReviewer, Authorizer
    from rankpack.nodeagent.server import AgentServer
    from rankpack.nodeagent.service import RANK_PODS_SELECTOR, NodeAgent, RankPods

    if not args.node:
        raise UserError("no node name: give --node or set NODE_NAME (the DaemonSet sets it "
                        "from spec.nodeName)")  # fmt: skip
    if not 0 < args.port < 65536:
        raise UserError(f"--port must be 1..65535, got {args.port}")
    pods_cgroup = resolve_pods_cgroup(args.pods_cgroup)
    kubeconfig = Path(args.kubeconfig).expanduser() if args.kubeconfig else None
    if kubeconfig is not None and not kubeconfig.is_file():
        raise UserError(f"kubeconfig {kubeconfig} does not exist")
    try:
        api = ClientKubeApi(KubernetesConfig(kubeconfig=kubeconfig), request_timeout_s=10.0)
    except BackendError as exc:
        raise UserError(str(exc)) from None
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    logging.getLogger("urllib3").setLevel(logging.ERROR)
    log = logging.getLogger("rankpack.nodeagent")
    reader = NodeReader(args.kubelet_root, args.cgroup_root, pods_cgroup)
    if not reader.available:
        log.warning("this node's pods are not visible here (%s/pods, %s/%s): readings will be "
                    "empty", args.kubelet_root, args.cgroup_root, pods_cgroup)  # fmt: skip
    # this node's rankpack pods: listed once, then watched (issue 29), read from the cache;
    # RankPods keeps the rank and group pods
    ranks = core("pods", labels=RANK_PODS_SELECTOR, fields=f"spec.nodeName={args.node}")
    cache = Cache(api)

    def listed() -> list[dict[str, object]]:
        found = cache.informer(ranks)
        if found.forbidden:
            raise ApiError(403, "Forbidden", "this node's pods may not be listed")
        return found.items()

    # every pod bound to this node (whoever's): what its requests add up to, for placement
    on_node = core("pods", fields=f"spec.nodeName={args.node}")

    def node_listed() -> list[dict[str, object]]:
        found = cache.informer(on_node)
        if found.forbidden:
            raise ApiError(403, "Forbidden", "this node's pods may not be listed")
        return found.items()

    pods = RankPods(listed, node_listed)
    agent = NodeAgent(args.node, reader, pods, Authorizer(ApiReviewer(api)))
    try:
        server = AgentServer((args.address, args.port), agent)
    except OSError as exc:
        raise UserError(f"cannot listen on {args.address}:{args.port}: {exc.strerror}") from None
    stop = threading.Event()
    previous = signal.signal(signal.SIGTERM, lambda *_: stop.set())
    server.start()
    log.info("node agent for %s on %s:%d", args.node, args.address, server.port)
    try:
        while not stop.wait(1.0):
            pass
    except KeyboardInterrupt:
        pass
    finally:
        signal.signal(signal.SIGTERM, previous)
        server.shutdown()
        server.server_close()
        cache.close()
    log.info("node agent stopped")
    return 0
