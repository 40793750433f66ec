"""What the Kubernetes backend learns of the nodes: its ranks' readings, the nodes' health,
what the cluster can hold.

- `nodereader`: the node-side reader of rank pods' cgroup counters and shim records;
- `readings`: where the backend gets readings (`Readings`: this node's files, `choose`);
- `agents`: `AgentReadings`, the client of the node agents;
- `nodehealth`: which nodes are lost, judged from Leases and Ready (pure);
- `lostnodes`: `NodeWatch`, lost nodes from the cached nodes and Leases;
- `capacity`: `ClusterCapacity`, the inventory and launch checks (nodes, pods, quota).
"""
