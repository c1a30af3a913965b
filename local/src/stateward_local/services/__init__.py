"""What the local cluster runs on the host beside the control plane for its real nodes, as
a cloud or a CNI would provide it: an S3 object store for backups (``objectstore``), a
volume provisioner (``provisioner``) and NetworkPolicy enforcement (``netpol``). CoreDNS is
the fourth; its Corefile is written with the node components' configuration."""
