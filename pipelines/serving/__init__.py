"""Serving a pipeline's model: the fleet as Kubernetes objects (objects.py) and the rollout as tasks (rollout.py).

python -m pipelines.serving -o workflow-templates/serving.yaml   # the flagship's fleet objects, for GitOps
"""
