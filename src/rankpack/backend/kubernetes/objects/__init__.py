"""A simulation's Kubernetes objects: built, read, checked against the namespace's rules,
created and deleted.

- `builders`: pure builders (spec in, objects and the mpirun command out);
- `groups`: rank groups, a simulation's ranks on one node (pure: plan, resources, nice
  values, the ranks annotation);
- `grouppods`: pure builders of a rank group's pod and the groups' hostfile;
- `keyed`: a launcher-pod simulation's key, its volume, where its tools are on the case
  volume and the rank pods' ``rankpack-rankd`` (pure);
- `launcherpods`: the pure builder of a launcher pod (its init container in rankpack's
  image with the token, its launcher container in the simulation's image without);
- `stagepods`: the pure builder of a staging pod (a case staged with its user's rights);
- `status`: pure readings of a pod's JSON (phase, allocation, resize state);
- `limits`: what the namespace's ResourceQuotas and LimitRanges allow (pure);
- `rbac`: the least-privilege identities (backend, node agent, launcher, operator);
- `reconcile`: creating a simulation's objects idempotently, deleting them through their
  owner.
"""
