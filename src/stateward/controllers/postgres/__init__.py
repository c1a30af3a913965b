"""PostgreSQL, the engine Patroni runs: the PostgresCluster reconciler and everything it drives.

* ``reconcile``: the PostgresCluster's checklist of phases, and the phases that converge its
  objects (finalizer, TLS, credentials, children, scale, volumes, the roll of its pods).
* ``backup_phases``, ``deletion`` and ``status``: the backup phases; the finalizer's phase
  and the final backup; the instances' diagnosis and the status. ``reconcile`` runs them,
  and none of them imports it.
* ``scope``: one reconcile's scope, and the helpers and recheck intervals more than one
  phase module uses, shared by ``reconcile``, its phase modules and ``dataplane`` without
  ``reconcile`` and ``dataplane`` importing each other.
* ``dataplane``: the Patroni client side — configuration, switchover, rolling restarts.
* ``members``: Patroni's member records (roles, lag, timelines) read from the pods.
* ``takeover``: failover. Patroni fails over; the operator releases a dead primary's leader
  lock early only on proof that it cannot accept writes.
* ``backups``, ``upgrades``, ``poolers`` and ``pgbouncer``: pgBackRest, major upgrades and
  the PgBouncer pooler.
"""
