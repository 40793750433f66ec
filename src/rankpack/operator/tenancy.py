"""The namespaces an operator serves, and where each one's files live (issue 26, item 7).

`rankpack operator --namespace A --namespace B` (or ``--namespace A,B``) serves the
Simulations of A and B; by default it serves the one namespace it runs in, as before. Each
Simulation's rank pods, launcher pod, Service, ConfigMap and Events stay in its own
namespace (one Kubernetes backend per namespace, `rankpack.backend.kubernetes.tenants`), and
the operator's rights there come from a Role the admin binds per namespace (``deploy/``);
it never creates Roles itself.

What a user of namespace A may reach through a Simulation is bounded per namespace, never
shared with B: the admin's paths may name ``{namespace}``, replaced by the Simulation's
namespace —

* ``--runs-root`` (the run directories the operator stages into),
* ``--volume`` (the claim, and its mount path, each namespace's rank pods get: a claim of
  the pods' own namespace, which the admin binds to that namespace's part of the shared
  storage),
* ``--case-root`` and ``--allow-host-path`` (what ``spec.case`` may name).

Serving several namespaces, every one of them must name ``{namespace}`` (`Tenancy.check`):
a run directory, case root or host prefix shared by two namespaces would let a user of one
read or change the other's files. Pure: no I/O.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass, replace
from pathlib import Path

from rankpack.errors import UserError
from rankpack.operator.admission import AdmissionPolicy

FIELD = "{namespace}"
"""What the admin's paths name to mean "the Simulation's namespace"."""
NAMESPACE_NAME = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")
"""A Kubernetes namespace name (an RFC 1123 label)."""


def parse_namespaces(values: Iterable[str]) -> tuple[str, ...]:
    """``--namespace`` values (repeated, or comma lists) as a list without repeats, in the
    order given; UserError for a name Kubernetes would not accept."""
    out: list[str] = []
    for value in values:
        for name in (n.strip() for n in value.split(",")):
            if not name:
                continue
            if not NAMESPACE_NAME.match(name):
                raise UserError(
                    f"--namespace {name!r} is not a namespace name (lowercase letters, "
                    "digits and '-', at most 63)"
                )
            if name not in out:
                out.append(name)
    return tuple(out)


def for_namespace(text: str, namespace: str) -> str:
    return text.replace(FIELD, namespace)


@dataclass(frozen=True)
class Tenancy:
    """Served namespaces and each one's run directories and volume."""

    namespaces: tuple[str, ...]
    """The namespaces whose Simulations are served (at least one)."""
    runs_root: str
    """Where run directories are staged; ``{namespace}`` names the Simulation's."""
    volume: str | None = None
    """The rank pods' volume for Simulations that name none (``pvc:CLAIM[:MOUNT]`` or
    ``host:DIR``; ``{namespace}`` as above); None: each run directory as a host path."""

    def runs_root_of(self, namespace: str) -> Path:
        return Path(for_namespace(self.runs_root, namespace))

    def volume_of(self, namespace: str) -> str | None:
        return for_namespace(self.volume, namespace) if self.volume else None

    @property
    def several(self) -> bool:
        return len(self.namespaces) > 1

    def check(self, admission: AdmissionPolicy) -> None:
        """UserError (one line, what to change) for a layout that would share files between
        namespaces, or whose rank pods would not see their run directories."""
        if not self.namespaces:
            raise UserError("no namespace to serve; give --namespace")
        if not self.runs_root.startswith("/"):
            raise UserError(f"--runs-root {self.runs_root!r} must be an absolute directory")
        if self.several:
            shared = [f"--runs-root {self.runs_root}"] if FIELD not in self.runs_root else []
            shared += [f"--volume {self.volume}" for v in [self.volume]
                       if v and _mount_text(v) is not None and FIELD not in v]  # fmt: skip
            shared += [f"--case-root {r}" for r in admission.case_roots if FIELD not in r]
            shared += [f"--allow-host-path {p}" for p in admission.host_prefixes
                       if FIELD not in p]  # fmt: skip
            if shared:
                raise UserError(
                    f"serving {len(self.namespaces)} namespaces, {shared[0]} would be shared "
                    f"by all of them (a user of one could read or change another's files); "
                    f"name {FIELD} in it, e.g. /var/lib/rankpack/namespaces/{FIELD}/runs"
                )
        for ns in self.namespaces:
            mount = _mount_text(self.volume_of(ns) or "")
            root = self.runs_root_of(ns)
            if mount is not None and not root.is_relative_to(mount):
                raise UserError(
                    f"the run directories of namespace {ns} ({root}) are not inside its rank "
                    f"pods' volume ({self.volume_of(ns)}, mounted at {mount}): the pods would "
                    "not see them; put --runs-root below the volume's mount path"
                )

    def admission_of(self, policy: AdmissionPolicy, namespace: str) -> AdmissionPolicy:
        """The admin's policy for a Simulation of ``namespace`` (its own case roots and host
        prefixes)."""
        if FIELD not in "".join((*policy.case_roots, *policy.host_prefixes)):
            return policy
        return replace(
            policy,
            case_roots=tuple(for_namespace(r, namespace) for r in policy.case_roots),
            host_prefixes=tuple(for_namespace(p, namespace) for p in policy.host_prefixes),
        )


def _mount_text(volume: str) -> str | None:
    """Where a volume is mounted in the rank pods, if the text says (``host:DIR``, or
    ``pvc:CLAIM:MOUNT``); None for none or ``pvc:CLAIM`` (mounted at the run directories'
    parent: the namespace's own runs root)."""
    kind, _, rest = volume.partition(":")
    if kind == "host" and rest:
        return rest
    if kind == "pvc" and rest:
        mount = rest.partition(":")[2]
        return mount or None
    return None
