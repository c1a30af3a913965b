"""Real nodes: a kubelet, containerd and kube-proxy per node, each node in its own namespaces.

A node is what a kind node is without Docker: a network namespace with one veth into the
host bridge of its cluster's slot (``stw0`` in slot 0; its own IP), a mount namespace in
which the paths the components hard-code (``/var/lib/kubelet``, ``/run/containerd``,
``/var/lib/cni``, ``/etc/cni/net.d``, ``/var/log/pods``, ``/run/netns``) are bind mounts of
the node's own state directories, and a cgroup subtree ``/stateward-SLOT/NODE`` in every
hierarchy that holds the node's daemons and, as the kubelet's ``cgroupRoot``, its pods. Both
namespaces are persistent: their files are bind mounted under ``STATE/nodes/NODE/ns``, so the
node outlives any one of its processes.

Routing lives on the host: each node's default route is the bridge address, and the host
routes each node's pod CIDR to the node's IP, so pods on different nodes, the host and the
API server reach each other. Forwarding from the bridge to anywhere else is dropped by our
own nftables table: nothing a pod sends leaves the machine.

* ``layout``: names, addresses, directories, the host slots (what one cluster holds on the
  host, so that clusters in different slots run side by side) and the facts every part
  shares.
* ``host``: the journal of host changes (written *before* each change, so ``down`` undoes
  exactly what ``up`` did, even after a crash), sysctls, cgroups, bridge, nftables, routes.
* ``lifecycle``: a node's namespaces, the wrapper its processes start in, and the drills
  (power off, freeze, partition).
* ``daemons``: containerd's, the kubelet's, kube-proxy's and the CNI's configuration.
* ``packages``: the Debian packages real nodes need on the host.
"""
