"""`rankpack operator`: the multiplexing controller as a Kubernetes operator on Simulation
resources; `rankpack simulations` lists them. `rankpack submit --backend kubernetes` creates
them (queue_cmd)."""

from __future__ import annotations

import argparse
import faulthandler
import logging
import os
import re
import signal
import uuid
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rich.console import Console

from rankpack.backend.kubernetes.api.config import (
    LAUNCHER_CHOICES,
    PodBounds,
    resolve_launcher,
)
from rankpack.backend.protocol import BackendError
from rankpack.cli.common import (
    data_dir,
    db_path,
    parse_concurrent,
    parse_cores,
    parse_limit,
    parse_mib_pair,
    parse_output_file,
    parse_seconds,
    print_json,
    print_listing,
)
from rankpack.cli.run_cmd import stop_on_signals
from rankpack.controller.decision import DEFAULT_COLOCATION_EFFICIENCY, ControllerSettings
from rankpack.core.actions import WAIT_SETTINGS
from rankpack.errors import UserError
from rankpack.operator.admission import AdmissionPolicy, NamespaceLimits, openfoam_applications
from rankpack.operator.crd import CLAIMED, PHASES, check_solver
from rankpack.operator.tenancy import parse_namespaces
from rankpack.plan.allocation import budget_to_millis
from rankpack.plan.submission import Submission

if TYPE_CHECKING:
    from rankpack.backend.kubernetes.api.kubeapi import ApiError


def add_cluster_arguments(p: argparse.ArgumentParser, *, several: bool = False) -> None:
    p.add_argument("--kubeconfig", help="kubeconfig file (default: as kubectl)")
    p.add_argument("--context", help="kubeconfig context (default: current)")
    if several:  # the operator serves several namespaces (issue 26, item 7)
        p.add_argument(
            "--namespace", action="append", default=[], metavar="NS",
            help="a namespace whose Simulations it serves (repeat, or a comma list: "
            "--namespace a,b; default: the one it runs in: in a pod its pod's, else the "
            "context's); each needs the Role deploy/ installs there. Its Lease is in its own "
            "namespace (in a pod its pod's, else the first --namespace)",
        )  # fmt: skip
        return
    p.add_argument("--namespace", help="namespace (default: the context's)")


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser(
        "operator",
        help="run Simulation resources on Kubernetes: profile, resize in place, pack, adopt",
        description=(
            "The multiplexing controller as a Kubernetes operator. Queued Simulations "
            "(simulations.rankpack.dev, deploy/base/crd.yaml) in the namespace are launched as "
            "rank pods, profiled, resized in place and packed, as `rankpack multiplex` does; their "
            "status shows phase, progress, per-rank CPU, resizes and the result, and its "
            "Events what was decided and why. Only the holder of the Lease acts; a restarted "
            "operator adopts the running simulations, and an operator whose apiserver went "
            "away stops acting once its Lease lapses and adopts them again when it is back. "
            "Ctrl-C/SIGTERM stop the operator and leave the simulations running."
        ),
    )
    add_cluster_arguments(p, several=True)
    _add_pod_arguments(p)
    _add_limit_arguments(p)
    _add_admission_arguments(p)
    p.add_argument("--metrics-port", type=int, help="serve Prometheus metrics on this port")
    p.add_argument("--identity", help="leader-election identity (default: HOST-PID)")
    p.add_argument("--lease", default="rankpack-operator", help="Lease name (rankpack-operator)")
    p.add_argument(
        "--until-idle", action="store_true",
        help="exit once no Simulation is queued or running (default: run until stopped)",
    )  # fmt: skip
    p.add_argument(
        "--plot", type=parse_output_file,
        help="when the operator ends, write the timeline of its session here (PNG): each "
        "run it followed, launch, profiling and resizes, as `rankpack multiplex --plot`",
    )  # fmt: skip
    p.add_argument("--json", action="store_true", help="print a JSON summary at the end")
    p.set_defaults(handler=handle_operator)

    s = sub.add_parser(
        "simulations", help="list the Simulation resources of a namespace (Kubernetes)"
    )
    add_cluster_arguments(s)
    s.add_argument("--json", action="store_true")
    s.set_defaults(handler=handle_simulations)


def _add_pod_arguments(p: argparse.ArgumentParser) -> None:
    """The operator's flags for its rank pods: image, launcher, transport, volume, run
    directories, wait mode and the CPU to place on."""
    p.add_argument(
        "--image", help="rankpack's rank image: a Simulation's by default, and where staging's "
        "Python and the launcher's wait run for every Simulation (default: in a pod, the "
        "operator's own image; else the dev cluster's host-usr image)"
    )  # fmt: skip
    p.add_argument(
        "--launcher", choices=LAUNCHER_CHOICES, default="auto",
        help="where each simulation's mpirun runs: pod (a launcher pod beside its ranks, so the "
        "operator needs no pods/exec and can move while simulations run), host (detached "
        "beside the operator), auto (default: pod unless the image is the dev cluster's "
        "host-usr)",
    )  # fmt: skip
    p.add_argument(
        "--mpi-transport", choices=["tcp", "auto"], default="auto",
        help="how the ranks of a simulation talk: auto (default: the MPI library's own "
        "choice, shared memory between the ranks of one pod, TCP between pods) or tcp "
        "(TCP over the pod network only, no shared-memory transport)",
    )  # fmt: skip
    p.add_argument(
        "--volume", help="where run directories live in the rank pods, for Simulations whose "
        "spec.case.volume is empty: pvc:CLAIM[:MOUNT_PATH] (a claim of the pods' namespace) "
        "or host:DIR; {namespace} is the Simulation's (default: each run directory as a host "
        "path, for the dev cluster)",
    )  # fmt: skip
    p.add_argument(
        "--runs-root", metavar="DIR",
        help="where run directories are staged (default: the data directory's runs/); "
        "{namespace} is the Simulation's namespace (required serving several: run "
        "directories apart per namespace, e.g. /var/lib/rankpack/namespaces/{namespace}/runs)",
    )  # fmt: skip
    p.add_argument(
        "--wait", choices=WAIT_SETTINGS, default="auto",
        help="how ranks wait inside MPI, for Simulations whose spec.wait is empty: auto "
        "(default; spin while each rank has a core or a node's ranks are all one Simulation's "
        "in one pod, polite where ranks outnumber a node's cores), spin, polite or adaptive",
    )  # fmt: skip
    p.add_argument(
        "--allocatable", type=parse_cores,
        help="CPU (cores) to place on when the identity may not read nodes (2 on the dev "
        "cluster)",
    )  # fmt: skip


def _add_limit_arguments(p: argparse.ArgumentParser) -> None:
    """The operator's flags for how much runs at once, and its profiling window."""
    p.add_argument(
        "--max-concurrent", type=parse_concurrent, default=4, help="simulations at once (4)"
    )
    p.add_argument(
        "--max-running-per-namespace", type=parse_limit, metavar="N",
        help="Simulations one namespace may have running at once; the next waits Queued "
        "(reason MaxRunningPerNamespace) (default: only --max-concurrent bounds them)",
    )  # fmt: skip
    p.add_argument(
        "--max-queued-per-namespace", type=parse_limit, default=100, metavar="N",
        help="Simulations one namespace may have queued; one more is refused (Failed, "
        "TooManyQueued) (default 100)",
    )  # fmt: skip
    p.add_argument(
        "--profile-s", type=parse_seconds, default=5.0, help="profiling window (default 5 s)"
    )
    p.add_argument(
        "--gate", choices=["limit", "duty", "off"], default="limit",
        help="launch gate: limit (the default): the physical limit of co-location times "
        f"{DEFAULT_COLOCATION_EFFICIENCY}; duty: the duty-cycle overlap model; off: launch "
        "whenever --max-concurrent allows and every rank fits",
    )  # fmt: skip


def _add_admission_arguments(p: argparse.ArgumentParser) -> None:
    """The admin's admission policy: host paths, case roots, solvers (`_admission`)."""
    p.add_argument(
        "--allow-host-path", action="append", default=[], metavar="DIR",
        help="a host directory under which a Simulation's spec.case.volume host:DIR may lie "
        "(repeat for several; {namespace} is the Simulation's namespace; default: none, host "
        "volumes are refused: HostVolumeNotAllowed)",
    )  # fmt: skip
    p.add_argument(
        "--case-root", action="append", default=[], metavar="DIR",
        help="a directory under which a Simulation's spec.case.path may lie (repeat for "
        "several; {namespace} is the Simulation's namespace; default: none, tutorial names "
        "only: CasePathNotAllowed)",
    )  # fmt: skip
    p.add_argument(
        "--allow-image", action="append", default=[], metavar="PREFIX[=SOLVER,...]",
        help="an image prefix a Simulation's spec.image may lie under: a registry, a "
        "repository or one image (repeat for several; default: none, only the operator's "
        "own rank image: ImageNotAllowed); =SOLVER,... names the only solvers its images "
        "may run (default: the OpenFOAM applications and --solver names)",
    )  # fmt: skip
    p.add_argument(
        "--staging-deadline", type=parse_seconds, default=600.0, metavar="S",
        help="the longest a case's staging pod may run (copy, mesh, decompose) before it is "
        "ended and its Simulation fails (default 600 s)",
    )  # fmt: skip
    b = PodBounds()
    for flag, (req, lim), what in (
        ("--rank-memory", b.rank_memory_mib, "memory per rank (a group pod: times its ranks)"),
        ("--rank-ephemeral-storage", b.rank_ephemeral_mib, "ephemeral storage per rank"),
        ("--launcher-memory", b.launcher_memory_mib, "a launcher pod's memory"),
    ):
        p.add_argument(
            flag, type=parse_mib_pair, default=(req, lim), metavar="REQUEST,LIMIT",
            help=f"{what}, MiB: the request and the limit of the pods that run a user's code "
            f"(never a CPU limit; default {req},{lim})",
        )  # fmt: skip
    p.add_argument(
        "--case-scan", choices=["on", "off"], default="on",
        help="refuse case code the scanner finds (#codeStream, coded types, libs paths, ...) "
        "before staging runs a tool: defence in depth behind the staging pod (default on)",
    )  # fmt: skip
    p.add_argument(
        "--solver", action="append", default=[], metavar="NAME",
        help="an application Simulations may run besides the OpenFOAM solvers installed in "
        "/usr/bin (repeat for several; others are refused: SolverNotAllowed)",
    )  # fmt: skip


def _config(args: argparse.Namespace) -> Any:
    from rankpack.backend.kubernetes.api.config import load_config, parse_transport
    from rankpack.devcluster.nodefiles import with_node_files

    # the operator's --namespace is the list it serves (`handle_operator`), not its own
    namespace = args.namespace if isinstance(args.namespace, str) else None
    config = with_node_files(load_config(args.kubeconfig, args.context, namespace,
                                         image=getattr(args, "image", None)))  # fmt: skip
    volume = getattr(args, "volume", None)
    if volume and not (volume.startswith(("host:/", "pvc:")) and len(volume) > 5):
        raise UserError(f"--volume '{volume}' not understood; use host:DIR or "
                        "pvc:CLAIM[:MOUNT_PATH]")  # fmt: skip
    if getattr(args, "allocatable", None) is not None:
        config = replace(config, allocatable_millis=budget_to_millis(args.allocatable))
    if getattr(args, "mpi_transport", None) is not None:
        config = replace(config, mpi_transport=parse_transport(args.mpi_transport))
    return config


def simulation_api(args: argparse.Namespace) -> Any:
    from rankpack.backend.kubernetes.api.client import ClientKubeApi
    from rankpack.operator.simapi import SimulationApi

    cfg = _config(args)
    try:
        api = ClientKubeApi(cfg)
    except BackendError as exc:
        raise UserError(str(exc)) from None
    return SimulationApi(api, cfg.namespace)


def _api_error(exc: ApiError, what: str) -> UserError:
    status = exc.status
    reason = exc.reason or type(exc).__name__
    hint = ""
    if status == 404:
        hint = "; is the CRD installed (kubectl apply -f deploy/base/crd.yaml)?"
    elif status == 403:
        hint = "; this identity may not (see deploy/base/backend.yaml)"
    # the apiserver's own words (an admission policy's code and reason), on one line
    said = " ".join(str(exc.message or "").split())[:300]
    said = f": {said}" if said else ""
    return UserError(f"{what}: {status or ''} {reason}{said}{hint}".replace("  ", " "))


def create_simulations(
    args: argparse.Namespace, sub: Submission, count: int, volume: str | None
) -> list[str]:
    from rankpack.backend.kubernetes.api.kubeapi import ApiError
    from rankpack.operator import crd

    api = simulation_api(args)
    base = "".join(c if c.isalnum() else "-" for c in sub.case.rsplit("/", 1)[-1].lower())
    base = base.strip("-")[:40] or "simulation"
    names = []
    for _ in range(count):
        name = f"{base}-{uuid.uuid4().hex[:6]}"
        try:
            api.create(crd.simulation(name, sub, volume))
        except ApiError as exc:
            raise _api_error(exc, f"cannot create Simulation {name}") from None
        names.append(name)
    return names


def list_simulations(args: argparse.Namespace) -> list[dict[str, Any]]:
    from rankpack.backend.kubernetes.api.kubeapi import ApiError

    api = simulation_api(args)
    try:
        items = api.list()
    except ApiError as exc:
        raise _api_error(exc, "cannot list Simulations") from None
    return sorted(items, key=lambda o: o["metadata"].get("creationTimestamp", ""))


def handle_simulations(args: argparse.Namespace) -> int:
    items = list_simulations(args)

    def cells(o: dict[str, Any]) -> list[str]:
        st, spec = o.get("status") or {}, o.get("spec") or {}
        return [
            o["metadata"]["name"], st.get("phase", "-"), str(spec.get("case", {}).get("path")),
            str(spec.get("ranks", "-")), str(st.get("progress", "-")),
            str(st.get("resizes", 0)), str(st.get("restarts", 0)), str(st.get("runId", "-")),
        ]  # fmt: skip

    return print_listing(
        args.json,
        [
            {"name": o["metadata"]["name"], "spec": o.get("spec"), "status": o.get("status") or {}}
            for o in items
        ],
        "no Simulations; create some with `rankpack submit CASE --backend kubernetes`",
        "simulations",
        ("name", "phase", "case", "ranks", "progress", "resizes", "restarts", "run"),
        lambda: map(cells, items),
    )


def _admission(args: argparse.Namespace) -> AdmissionPolicy:
    """The admin's admission policy from the flags (absolute directories, command names)."""
    for flag, dirs in (("--allow-host-path", args.allow_host_path),
                       ("--case-root", args.case_root)):  # fmt: skip
        for d in dirs:
            if not d.startswith("/") or ".." in d.split("/"):
                raise UserError(f"{flag} {d!r} must be an absolute directory without '..'")
    solvers = {check_solver(s, "--solver") for s in args.solver}
    images, image_solvers = [], []
    for given in args.allow_image:
        prefix, has_list, names = given.partition("=")
        if not re.fullmatch(r"[a-z0-9][a-z0-9._:/@-]{0,511}", prefix):
            raise UserError(f"--allow-image {prefix[:120]!r} must be an image reference or a "
                            "prefix of one, such as registry.example.com/cfd/")  # fmt: skip
        images.append(prefix)
        if has_list:
            named = {check_solver(n.strip(), "--allow-image's solvers") for n in names.split(",")}
            if None in named:
                raise UserError(f"--allow-image {given[:120]!r}: name its solvers after '=', "
                                "e.g. registry.example/cfd=simpleFoam,mySolver")  # fmt: skip
            image_solvers.append((prefix, frozenset(n for n in named if n)))
    return AdmissionPolicy(
        host_prefixes=tuple(args.allow_host_path),
        case_roots=tuple(args.case_root),
        images=tuple(images),
        image_solvers=tuple(image_solvers),
        solvers=frozenset(openfoam_applications() | {s for s in solvers if s}),
    )


def own_image(config: Any) -> str | None:
    """In a pod (in-cluster configuration, ``POD_NAME`` from the downward API): the image the
    operator itself runs, the default for its rank and launcher pods (``deploy/`` runs the
    operator from the rank image, so one `kustomize edit set image` moves both)."""
    pod = os.environ.get("POD_NAME")
    if config.kubeconfig is not None or not pod:
        return None
    from rankpack.backend.kubernetes.api.client import ClientKubeApi

    try:
        containers = ClientKubeApi(config).get_pod(pod)["spec"]["containers"]
    except (BackendError, KeyError, IndexError) as exc:
        raise UserError(f"cannot read this operator's own pod {pod} for its image: {exc}; "
                        "give --image") from None  # fmt: skip
    image = next((c.get("image") for c in containers if c.get("name") == "operator"), None)
    return str(image or containers[0].get("image") or "") or None


def handle_operator(args: argparse.Namespace) -> int:
    from rankpack.operator.service import OperatorOptions, run_operator

    if args.max_concurrent < 1:
        raise UserError(f"--max-concurrent must be at least 1, got {args.max_concurrent}")
    if args.profile_s <= 0:
        raise UserError(f"--profile-s must be positive, got {args.profile_s:g}")
    if args.metrics_port is not None and not 0 < args.metrics_port < 65536:
        raise UserError(f"--metrics-port must be 1..65535, got {args.metrics_port}")
    admission = _admission(args)
    served = parse_namespaces(args.namespace)
    config = _config(args)  # in a pod: the pod's namespace; else the context's
    if served and config.kubeconfig is not None:
        # out of the cluster the first --namespace is also its own (the Lease's), as before
        config = replace(config, namespace=served[0])
    if args.image is None:
        image = own_image(config)
        if image:
            config = replace(config, image=image)
    config = replace(config, launcher=resolve_launcher(args.launcher, config.image))
    # its own rank image is always allowed (what a Simulation without spec.image runs)
    admission = replace(admission, images=(config.image, *admission.images))
    if not 1 <= args.staging_deadline <= 86400:
        raise UserError(f"--staging-deadline must be 1 to 86400 s, got {args.staging_deadline:g}")
    config = replace(config, staging=replace(config.staging,
                                             deadline_s=int(args.staging_deadline)))  # fmt: skip
    config = replace(config, pod_bounds=replace(
        config.pod_bounds, rank_memory_mib=args.rank_memory,
        rank_ephemeral_mib=args.rank_ephemeral_storage, launcher_memory_mib=args.launcher_memory,
    ))  # fmt: skip
    opts = OperatorOptions(
        config=config,
        runs_root=Path(args.runs_root) if args.runs_root else data_dir() / "runs",
        namespaces=served,
        db_path=db_path(args),
        identity=args.identity or "",
        lease_name=args.lease,
        metrics_port=args.metrics_port,
        controller=ControllerSettings(max_concurrent=args.max_concurrent,
                                      profile_s=args.profile_s, gate=args.gate),
        until_idle=args.until_idle,
        wait_mode=args.wait,
        plot=args.plot,
        volume=args.volume,
        admission=admission,
        namespace_limits=NamespaceLimits(max_queued=args.max_queued_per_namespace,
                                         max_running=args.max_running_per_namespace),
        case_scan=args.case_scan == "on",
    )  # fmt: skip
    logging.basicConfig(level=logging.WARNING)
    # an apiserver that is away is reported once by the operator, not per retried request
    logging.getLogger("urllib3").setLevel(logging.ERROR)
    faulthandler.register(signal.SIGUSR1, all_threads=True)  # kill -USR1: where it waits
    console = Console(stderr=True)
    with stop_on_signals() as stop:
        try:
            result = run_operator(
                opts, stop=stop, say=(lambda m: None) if args.json else console.print
            )
        except BackendError as exc:
            raise UserError(str(exc)) from None
    if args.json:
        print_json({"status": result.status, "adopted": result.adopted,
                    "requeued": result.requeued, "finished": result.finished,
                    "terms": result.terms, "multiplex_id": result.multiplex_id,
                    "timeline_png": result.plot})  # fmt: skip
    else:
        console.print(f"operator {result.status}: adopted {result.adopted}, requeued "
                      f"{result.requeued}, finished {len(result.finished)}, "
                      f"terms {result.terms}")  # fmt: skip
    return 0 if result.status in ("idle", "stopped") else 1


# -- `rankpack queue|runs list|events --backend kubernetes`: read from the cluster ----------


def add_read_backend(p: argparse.ArgumentParser, what: str) -> None:
    p.add_argument(
        "--backend", choices=["local", "kubernetes"], default="local",
        help=f"local (default): this machine's database; kubernetes: {what}",
    )  # fmt: skip
    add_cluster_arguments(p)


def _row(o: dict[str, Any]) -> dict[str, Any]:
    """A Simulation as `queue`/`runs list --backend kubernetes --json` print it."""
    spec, st = o.get("spec") or {}, o.get("status") or {}
    ended = next((c.get("lastTransitionTime") for c in st.get("conditions") or []
                  if c.get("type") in ("Succeeded", "Failed") and c.get("status") == "True"),
                 None)  # fmt: skip
    return {
        "name": o["metadata"]["name"],
        "phase": st.get("phase") or "Queued",
        "case": (spec.get("case") or {}).get("path"),
        "ranks": spec.get("ranks"),
        "iterations": st.get("iterations"),
        "expected_iterations": st.get("expectedIterations") or spec.get("iterations"),
        "progress": st.get("progress"),
        "resizes": st.get("resizes"),
        "restarts": st.get("restarts"),
        "run_id": st.get("runId"),
        "operator": st.get("operator"),
        "submitted_at": o["metadata"].get("creationTimestamp"),
        "started_at": st.get("startedAt"),
        "finished_at": ended,
        "result": st.get("result"),
    }


def handle_queue_kubernetes(args: argparse.Namespace) -> int:
    phases = PHASES if args.all else ("Queued", *CLAIMED)
    rows = [r for r in map(_row, list_simulations(args)) if r["phase"] in phases]
    return print_listing(
        args.json,
        rows,
        "no Simulation is queued or running; create some with `rankpack submit CASE "
        "--backend kubernetes`",
        "simulations: queue",
        ("name", "submitted", "case", "ranks", "phase", "progress", "run", "operator"),
        lambda: map(_queue_cells, rows),
    )


def _queue_cells(r: dict[str, Any]) -> list[str]:
    return [
        r["name"], str(r["submitted_at"] or "-").replace("T", " ")[:19], str(r["case"]),
        str(r["ranks"] or "-"), r["phase"], str(r["progress"] or "-"),
        str(r["run_id"] or "-"), str(r["operator"] or "-"),
    ]  # fmt: skip


FINISHED_COLUMNS = ("name", "case", "ranks", "phase", "iterations", "wall s", "cpu s",
                    "resizes", "restarts", "message")  # fmt: skip


def handle_runs_kubernetes(args: argparse.Namespace) -> int:
    rows = [r for r in map(_row, list_simulations(args)) if r["phase"] in ("Succeeded", "Failed")]
    rows = sorted(rows, key=lambda r: str(r["finished_at"] or ""), reverse=True)[: args.limit]

    def cells(r: dict[str, Any]) -> list[str]:
        res = r["result"] or {}
        return [
            r["name"], str(r["case"]), str(r["ranks"] or "-"), r["phase"],
            str(res.get("iterations", r["iterations"])), str(res.get("wallSeconds", "-")),
            str(res.get("cpuSeconds", "-")), str(r["resizes"] or 0), str(r["restarts"] or 0),
            str(res.get("message") or "")[:80],
        ]  # fmt: skip

    return print_listing(
        args.json,
        rows,
        "no Simulation has finished yet (rankpack queue --backend kubernetes)",
        "simulations: finished",
        FINISHED_COLUMNS,
        lambda: map(cells, rows),
    )


def handle_events_kubernetes(args: argparse.Namespace) -> int:
    from rankpack.backend.kubernetes.api.kubeapi import ApiError

    api = simulation_api(args)
    try:
        events = api.events(args.simulation)
    except ApiError as exc:
        raise _api_error(exc, "cannot list Events") from None
    rows = [
        {
            "time": e.get("lastTimestamp") or e.get("eventTime"),
            "simulation": (e.get("involvedObject") or {}).get("name"),
            "type": e.get("type"),
            "reason": e.get("reason"),
            "message": e.get("message"),
            "count": e.get("count") or 1,
        }
        for e in events
    ]
    return print_listing(
        args.json,
        rows,
        "no Events on Simulations (they come from `rankpack operator`)",
        "events on simulations",
        ("time", "simulation", "type", "reason", "message"),
        lambda: (
            [
                str(r["time"] or "-").replace("T", " ")[:19],
                str(r["simulation"]),
                *(str(r[k]) for k in ("type", "reason", "message")),
            ]
            for r in rows
        ),
    )
