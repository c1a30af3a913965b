"""The embedded local cluster for development and tests: a real control plane (etcd,
kube-apiserver, controller-manager, scheduler) as processes on this machine, built from the
Go module proxy (``binaries``); nodes that run real containers in their own network
namespaces (``nodes``: containerd, the kubelet, CNI, our images from ``images``) beside
kwok's simulated ones; and the services they need (the volume ``provisioner``, an
``objectstore`` for backups, ``netpol`` to enforce NetworkPolicies). The operator never
imports it (an import-linter contract); only the CLI that starts it does."""
