"""The Kueue Topology and topology-aware ResourceFlavor of the flagship's `cluster.topology` (eksflow/topology.py)."""
