"""The API-level half of Simulation admission (issue 26): a ValidatingAdmissionPolicy whose
parameter is a ConfigMap holding the cluster admin's allowlist, so that a host volume or a
case path the admin did not allow is refused at ``kubectl create`` (HTTP 422), before the
operator ever sees it. ``deploy/base/admission.yaml`` is generated from `admission_objects`.

A webhook would need a Service the apiserver can reach (the dev cluster has no kube-proxy
or cluster DNS); CEL runs inside the apiserver. It checks what can be checked as text, the
same rules as `rankpack.operator.admission` (which stays in force behind it, and alone
checks symbolic links on disk and the solver allowlist):

* ``spec.case.volume: host:DIR``: DIR absolute, no ``..``, under one of the ConfigMap's
  ``hostPathPrefixes`` (comma-separated; empty: none);
* ``spec.case.path``: a tutorial name, or absolute, no ``..``, under one of ``caseRoots``;
* ``spec.image``: one of ``imagePrefixes`` or continuing one after ``/``, ``:`` or ``@``
  (`rankpack.plan.images.image_allowed`); none given: only Simulations without an
  image pass.

``{namespace}`` in either list is the Simulation's namespace (``request.namespace``), so
that each served namespace has its own roots (``deploy/tenants``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from rankpack.operator import crd

Obj = dict[str, Any]

POLICY = "rankpack-simulations"
PARAMS = "rankpack-admission"

_HOST = "variables.volume.substring(5)"
_VALIDATIONS = [
    {
        "expression": (
            "!variables.volume.startsWith('host:') || ("
            f"{_HOST}.startsWith('/') && !{_HOST}.split('/').exists(c, c == '..') && "
            f"variables.hostPrefixes.exists(p, {_HOST} == p || {_HOST}.startsWith(p + '/')))"
        ),
        "messageExpression": (
            "'HostVolumeNotAllowed: spec.case.volume ' + variables.volume + ' mounts a host "
            "directory the cluster admin did not allow (allowed: ' + "
            "(size(variables.hostPrefixes) == 0 ? 'none' : variables.hostPrefixes.join(', ')) + "
            "'); use a pvc: volume of your namespace'"
        ),
        "reason": "Invalid",
    },
    {
        "expression": (
            "!variables.path.contains('/') ? "
            "variables.path.matches('^[A-Za-z0-9][A-Za-z0-9_.+-]{0,127}$') : ("
            "variables.path.startsWith('/') && "
            "!variables.path.split('/').exists(c, c == '..') && "
            "variables.caseRoots.exists(r, variables.path == r || "
            "variables.path.startsWith(r + '/')))"
        ),
        "messageExpression": (
            "'CasePathNotAllowed: spec.case.path ' + variables.path + ' is neither a tutorial "
            "name nor under a case root the cluster admin allowed (' + "
            "(size(variables.caseRoots) == 0 ? 'none' : variables.caseRoots.join(', ')) + ')'"
        ),
        "reason": "Invalid",
    },
]


_IMAGE = "object.spec.image"
_VALIDATIONS.append({
    "expression": (
        f"!has({_IMAGE}) || variables.imagePrefixes.exists(p, {_IMAGE} == p || "
        f"({_IMAGE}.startsWith(p) && (p.endsWith('/') || p.endsWith(':') || p.endsWith('@') "
        f"|| {_IMAGE}.substring(size(p), size(p) + 1) in ['/', ':', '@'])))"
    ),
    "messageExpression": (
        f"'ImageNotAllowed: spec.image ' + {_IMAGE} + ' is not an image the cluster admin "
        "allows (allowed prefixes: ' + (size(variables.imagePrefixes) == 0 ? 'none' : "
        "variables.imagePrefixes.join(', ')) + '); leave spec.image out for the default "
        "image'"
    ),
    "reason": "Invalid",
})  # fmt: skip


def _list_param(key: str) -> str:
    """A comma-separated ConfigMap entry as a list of prefixes without a trailing '/', each
    ``{namespace}`` in them replaced by the Simulation's namespace (an operator serving
    several namespaces gives each its own roots: `rankpack.operator.tenancy`)."""
    return (
        f"has(params.data) && '{key}' in params.data ? params.data['{key}'].split(',')"
        ".map(p, p.trim()).filter(p, p != '')"
        ".map(p, p.replace('{namespace}', request.namespace))"
        ".map(p, p.endsWith('/') && size(p) > 1 ? p.substring(0, size(p) - 1) : p) : []"
    )


def _image_param() -> str:
    """The ConfigMap's ``imagePrefixes``, as written (a prefix keeps its trailing ``/``)."""
    return (
        "has(params.data) && 'imagePrefixes' in params.data ? "
        "params.data['imagePrefixes'].split(',').map(p, p.trim()).filter(p, p != '') : []"
    )


def params_map(namespace: str, data: dict[str, str]) -> Obj:
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": PARAMS, "namespace": namespace, "labels": dict(crd.MANAGED_BY)},
        "data": data,
    }


def admission_objects(
    namespace: str,
    host_prefixes: Sequence[str] = (),
    case_roots: Sequence[str] = (),
    image_prefixes: Sequence[str] = (),
    name: str = POLICY,
) -> list[Obj]:
    """The parameter ConfigMap (in ``namespace``), the policy and its binding (``name``:
    the policy's and the binding's; a test's own keeps clear of an installed one's)."""
    params = params_map(namespace, {
        "hostPathPrefixes": ",".join(host_prefixes), "caseRoots": ",".join(case_roots),
        "imagePrefixes": ",".join(image_prefixes),
    })  # fmt: skip
    policy = {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "ValidatingAdmissionPolicy",
        "metadata": {"name": name, "labels": dict(crd.MANAGED_BY)},
        "spec": {
            "failurePolicy": "Fail",
            "paramKind": {"apiVersion": "v1", "kind": "ConfigMap"},
            "matchConstraints": {
                "resourceRules": [
                    {
                        "apiGroups": [crd.GROUP],
                        "apiVersions": ["*"],
                        "operations": ["CREATE", "UPDATE"],
                        "resources": [crd.PLURAL],
                    }
                ]
            },
            "variables": [
                {
                    "name": "volume",
                    "expression": "has(object.spec.case.volume) ? object.spec.case.volume : ''",
                },
                {"name": "path", "expression": "object.spec.case.path"},
                {"name": "hostPrefixes", "expression": _list_param("hostPathPrefixes")},
                {"name": "caseRoots", "expression": _list_param("caseRoots")},
                {"name": "imagePrefixes", "expression": _image_param()},
            ],
            "validations": _VALIDATIONS,
        },
    }
    binding = {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "ValidatingAdmissionPolicyBinding",
        "metadata": {"name": name, "labels": dict(crd.MANAGED_BY)},
        "spec": {
            "policyName": name,
            "validationActions": ["Deny"],
            "paramRef": {
                "name": PARAMS,
                "namespace": namespace,
                "parameterNotFoundAction": "Deny",
            },
        },
    }
    return [params, policy, binding]
