"""Serving a pipeline's model: the fleet as Kubernetes objects (objects.py) and the rollout as tasks (rollout.py).

python -m pipelines.serving -o workflow-templates/serving.yaml   # the flagship's fleet objects, for GitOps

Importing the package registers the local fleet (local_fleet.py) with the local executor, so a run of any pipeline
that uses the rollout, and a retry, resubmit or resume from that pipeline's file, runs the serving objects here.
"""

from pipelines.serving import local_fleet

__all__ = ["local_fleet"]
