"""Pure builders: a resource's spec in, the desired Kubernetes objects out. No I/O.

Every object is a JSON-ready dict for server-side apply under one field manager: complete
``apiVersion``/``kind``/``metadata``, only the fields Stateward owns, never a None value.

What every engine uses sits here (``meta``, ``pods``, ``network``, ``tls``, ``pinning``,
``passwords``, and ``database``: a postgres Database as a PostgresCluster); each engine's own
builders are a package of their own: ``postgres`` (a PostgresCluster's children) and
``mariadb`` (a MariaDB or MySQL Database's servers).
"""
