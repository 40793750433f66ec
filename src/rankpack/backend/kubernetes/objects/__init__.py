"""A simulation's Kubernetes objects: built, read, checked against the namespace's rules,
created and deleted.

- `builders`: pure builders (spec in, objects and the mpirun command out);
- `status`: pure readings of a pod's JSON (phase, allocation, resize state);
- `limits`: what the namespace's ResourceQuotas and LimitRanges allow (pure);
- `rbac`: the least-privilege identities (backend, node agent, launcher, operator);
- `reconcile`: creating a simulation's objects idempotently, deleting them through their
  owner.
"""
