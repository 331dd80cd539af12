"""The eksflow SDK: Hera building blocks (core/), the local executor (local/) and the pipeline files."""
