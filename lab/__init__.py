"""The harness the tests and the benchmarks share: the fault matrices (``faults``,
``database_faults``) and how to drive them, writers and SQL against the clusters
(``dataplane``, ``databases``), kwok's simulated roles (``kwok``), the operator as a process
(``operator``) and deadline-bound waits (``waiting``). It is neither part of the operator nor
of the local cluster: nothing installs it, no image carries it, and it imports neither
``tests`` nor ``bench`` (import-linter contracts)."""
