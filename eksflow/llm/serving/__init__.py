"""Serving an LLM pipeline's model: the fleet as Kubernetes objects (objects.py) and the rollout as tasks (rollout.py).

Importing the package registers the local fleet (local_fleet.py) with the local executor, so a run of any pipeline
that uses the rollout, and a retry, resubmit or resume from that pipeline's file, runs the serving objects here.
"""

from eksflow.llm.serving import local_fleet

__all__ = ["local_fleet"]
