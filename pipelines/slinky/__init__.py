"""The Slinky objects of the flagship's `cluster.launcher: slurm` (eksflow/launchers/slinky.py), for GitOps."""
