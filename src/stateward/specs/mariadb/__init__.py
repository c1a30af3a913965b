"""The MariaDB and MySQL engine's builders: ``servers``, a Database's StatefulSet of servers,
its Services, configuration, scripts and credentials."""
