"""`rankpack node-agent`: what only a node can see of its rank pods, served to the backend.

One agent per node (a DaemonSet, decision 0010) reads its node's rank pods with the
Kubernetes backend's node reader (cgroup counters, CPU pressure, the shim's live records in
each pod's own volume) and sets their ranks' wait modes, over an HTTP API on the
pod network authenticated with ServiceAccount tokens. It is the only rankpack component
with host mounts.

Modules: `auth` (who may ask what: bearer tokens reviewed by the apiserver), `service`
(the API apart from HTTP: a request in, a response out), `server` (the HTTP server around
it), `metrics` (Prometheus text), `manifests` (the DaemonSet and its RBAC objects).
"""
