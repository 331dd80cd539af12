"""eksflow: one Python file per LLM pipeline, run locally or submitted unchanged to Argo Workflows on EKS."""
