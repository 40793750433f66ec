"""The Kubernetes backend's boundary to the Kubernetes API (only `client` and `config` touch
the official ``kubernetes`` client).

- `kubeapi`: `KubeApi`, the interface every caller uses (JSON in and out), its `ApiError`
  family and the `RequestCounter`;
- `client`: `ClientKubeApi`, `KubeApi` on the official client (REST calls, watches, exec);
- `config`: `KubernetesConfig` and `load_config` (kubectl's defaults), the case volume's
  shape (`parse_volume`);
- `informer`: the shared local cache (list once, then watch) every reader uses;
- `incluster`: `InClusterPods`, one namespace's pods listed on urllib3 alone (the launcher
  pod's init container, whose start-up the official client's import would slow).
"""
