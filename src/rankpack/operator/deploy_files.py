"""``python -m rankpack.operator.deploy_files [DIR]``: writes ``deploy/`` from the builders.

The builders are pure (`rankpack.operator.manifests` for the base and the dev overlay,
`rankpack.operator.tenant_manifests` for the overlays that serve several namespaces, on top
of the first); this module gathers their files (`files`, which a unit test compares with
``deploy/``) and writes them. ``tenants DIR NS...`` writes an overlay for another list of
namespaces.
"""

from __future__ import annotations

import sys
from pathlib import Path

from rankpack.backend.kubernetes.objects.rbac import (
    DEPLOY_NAMESPACE,
    backend_nodes_rbac,
    backend_rbac,
)
from rankpack.nodeagent import manifests as agent_manifests
from rankpack.operator import monitoring, tenant_manifests
from rankpack.operator.manifests import (
    BACKEND_HEADER,
    DEV_HEADER,
    GENERATED,
    KUSTOMIZE_HEADER,
    SYSTEM_NAMESPACE,
    TENANT_HEADER,
    admission_yaml,
    crd_yaml,
    dev_admission_patch,
    dev_kustomization,
    dev_namespace_patch,
    dev_runs_volume,
    dev_tenant_volume,
    docs,
    kustomization,
    namespaces,
    operator_yaml,
    priority_class,
    runs_claim,
)
from rankpack.operator.tenancy import parse_namespaces


def files() -> dict[str, str]:
    """Every generated file of ``deploy/``, by its path below it."""
    pvc_header = ("# The operator's claim: its store and every served namespace's files.\n"
                  + GENERATED)  # fmt: skip
    top = {"apiVersion": "kustomize.config.k8s.io/v1beta1", "kind": "Kustomization",
           "resources": ["base"]}  # fmt: skip
    return {
        # the base lives in base/ (an overlay may not sit inside its base's folder); this
        # one only names it, so that `kubectl apply -k deploy/` is the admin's command
        "kustomization.yaml": docs(KUSTOMIZE_HEADER, [top]),
        "base/kustomization.yaml": docs(GENERATED, [kustomization()]),
        "base/namespaces.yaml": docs(GENERATED, [*namespaces(), priority_class()]),
        "base/crd.yaml": crd_yaml(),
        "base/admission.yaml": admission_yaml(),
        "base/backend.yaml": docs(
            BACKEND_HEADER,
            [*backend_rbac(DEPLOY_NAMESPACE), *backend_nodes_rbac(DEPLOY_NAMESPACE)],
        ),
        f"base/{DEPLOY_NAMESPACE}.yaml": docs(
            TENANT_HEADER, tenant_manifests.namespace_objects(DEPLOY_NAMESPACE)
        ),
        "base/node-agent.yaml": docs(
            agent_manifests.HEADER, agent_manifests.agent_objects(SYSTEM_NAMESPACE)
        ),
        "base/runs-pvc.yaml": docs(pvc_header, [runs_claim()]),
        "base/operator.yaml": operator_yaml(),
        "dev/kustomization.yaml": docs(DEV_HEADER, [dev_kustomization()]),
        "dev/runs-pv.yaml": docs(
            GENERATED, [dev_runs_volume(), dev_tenant_volume(DEPLOY_NAMESPACE)]
        ),
        "dev/namespace-patch.yaml": docs(GENERATED, [dev_namespace_patch()]),
        "dev/admission-patch.yaml": docs(GENERATED, [dev_admission_patch()]),
        # serving several namespaces: deploy/tenants (and deploy/dev-tenants) list them
        **tenant_manifests.files(),
        # watching it: where Prometheus (and its Operator) and Grafana run
        "monitoring/rules.yaml": docs(monitoring.HEADER, [{"groups": monitoring.rule_groups()}]),
        "monitoring/prometheusrule.yaml": docs(
            monitoring.HEADER, [monitoring.prometheus_rule(SYSTEM_NAMESPACE)]
        ),
        "monitoring/dashboard.json": monitoring.dashboard_json(),
    }


def main(argv: list[str] | None = None) -> int:
    """``[DIR]``: write ``deploy/`` (default ``deploy``); ``tenants DIR NS... [--base PATH]``:
    write an overlay serving the namespaces NS into DIR (its base: PATH, default
    ``../base``), as ``deploy/tenants`` is for its example namespaces."""
    args = sys.argv[1:] if argv is None else argv
    usage = (
        "usage: python -m rankpack.operator.deploy_files [DIR]  (default: deploy)\n"
        "       python -m rankpack.operator.deploy_files tenants DIR NS... [--base PATH]"
    )
    if args[:1] in (["-h"], ["--help"]):
        print(usage)
        return 0
    if args[:1] == ["tenants"]:
        return _tenants(args[1:])
    if len(args) > 1 or (args and args[0].startswith("-")):
        print(f"rankpack.operator.deploy_files: unexpected {' '.join(args)!r}: give one output "
              "directory (or none: deploy); see --help", file=sys.stderr)  # fmt: skip
        return 2
    out = Path(args[0] if args else "deploy")
    written = files()
    _write(out, written)
    print(f"wrote {len(written)} files under {out}")
    return 0


def _tenants(args: list[str]) -> int:
    base = "../base"
    if "--base" in args:
        at = args.index("--base")
        base, args = args[at + 1], args[:at] + args[at + 2 :]
    if len(args) < 2:
        print("usage: python -m rankpack.operator.deploy_files tenants DIR NS... [--base PATH]",
              file=sys.stderr)  # fmt: skip
        return 2
    out, namespaces = Path(args[0]), parse_namespaces(args[1:])
    written = tenant_manifests.overlay(namespaces, base, where=f"{out}/")
    _write(out, written)
    print(f"wrote {len(written)} files under {out}: kubectl apply -k {out}")
    return 0


def _write(out: Path, written: dict[str, str]) -> None:
    for name, text in written.items():
        (out / name).parent.mkdir(parents=True, exist_ok=True)
        (out / name).write_text(text)


if __name__ == "__main__":
    sys.exit(main())
