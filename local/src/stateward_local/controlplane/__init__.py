"""The control plane of the local cluster as processes on this machine: etcd, kube-apiserver,
the controller-manager, the scheduler and kwok (``components``: their command lines,
identities and kubeconfigs), the processes that run them (``processes``: started, recorded
by pid and kernel start time, stopped) and the certificates (``pki``)."""
