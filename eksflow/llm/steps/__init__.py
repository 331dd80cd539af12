"""Step modules: each `python -m eksflow.llm.steps.<name>` does one stage of the pipeline's real work.

Steps never import `pipelines` or hera, so a step image needs only its runtime libraries.
"""
