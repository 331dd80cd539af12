"""What every step shares: argument parsing, Argo outputs and progress, storage, base-model loading."""
