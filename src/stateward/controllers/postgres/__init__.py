"""PostgreSQL, the engine Patroni runs: the PostgresCluster reconciler and everything it drives.

* ``reconcile``: the PostgresCluster's phases (children, credentials, TLS, backups, scale,
  deletion) and its status.
* ``scope``: one reconcile's scope, shared by ``reconcile`` and ``dataplane`` without either
  importing the other.
* ``dataplane``: the Patroni client side — configuration, switchover, rolling restarts.
* ``members``: Patroni's member records (roles, lag, timelines) read from the pods.
* ``takeover``: failover. Patroni fails over; the operator releases a dead primary's leader
  lock early only on proof that it cannot accept writes.
* ``backups``, ``upgrades``, ``poolers`` and ``pgbouncer``: pgBackRest, major upgrades and
  the PgBouncer pooler.
"""
