"""What a step imports: its typed argument model, the exit-code contract, Argo outputs and progress.

Nothing here imports hera or the authoring layer, so a step image needs only its runtime libraries.
"""
