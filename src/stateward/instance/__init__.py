"""What runs inside the database pods: ``stateward-instance`` (Patroni under a supervisor,
backup and restore, the pooler, major upgrades) and the contract the pods share with the
operator — labels, usernames, ports, paths, credential files (``instance.patroni``).

A leaf below every layer, the API included: the pods run on what their ConfigMap and
Secrets say, never on the PostgresCluster model. What the configuration says for a cluster
is the operator's to build (``specs.postgres.config``, ``specs.postgres.backup``), from these names.
"""
