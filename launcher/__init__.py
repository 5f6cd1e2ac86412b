"""toposerve launcher: probe the GPU topology, plan TP/PP/replicas, check the machine, serve."""
