"""Pure builders: a PostgresCluster model in, the desired Kubernetes objects out. No I/O."""
