"""This project's pipeline files: each a short Hera DAG built with eksflow, run as a file or with `python -m`."""
