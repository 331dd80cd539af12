"""eksflow's LLM library (`pip install "eksflow[llm]"`): the serving engines' installer, with more to come."""
