"""MariaDB and MySQL, the engines the operator replicates itself: ``reconcile`` (the phases
of a Database of those engines and its status), ``failover`` (which server is the primary:
a pure decision over what every server reports) and ``sql`` (the client that asks the servers
and changes their replication)."""
