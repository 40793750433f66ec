"""`rankpack node-agent`: what only a node can see of its rank pods, served to the backend.

One agent per node (a DaemonSet, decision 0010) reads its node's rank pods with
`rankpack.backend.kubernetes.nodes.nodereader` (cgroup counters, CPU pressure, the shim's live
records in each pod's own volume) and sets their ranks' wait modes, over an HTTP API on the
pod network authenticated with ServiceAccount tokens (`auth`): `service` answers requests,
`server` serves them, `metrics` exposes Prometheus text, `manifests` builds the DaemonSet.
It is the only rankpack component with host mounts.
"""
