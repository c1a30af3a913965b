"""The embedded local cluster: control-plane binaries, processes, simulated nodes."""
