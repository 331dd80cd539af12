"""The flagship's serving objects as YAML, for GitOps (eksflow.llm.serving builds them).

Render them with `python -m pipelines.serving -o workflow-templates/serving.yaml`.
"""
