"""What a step imports: its typed argument model, the exit-code contract, Argo outputs and progress.

Nothing here imports hera or the authoring layer, so a step image needs only its runtime libraries. The same names
are in the flat `eksflow` namespace (loaded lazily, so importing them there stays as light).
"""

from eksflow.runtime.args import Location, Settings, StepArgs, StepFailedError, StepInputError, run_step
from eksflow.runtime.outputs import Progress

__all__ = ["Location", "Progress", "Settings", "StepArgs", "StepFailedError", "StepInputError", "run_step"]
