"""What a step imports: its typed argument model, the exit-code contract, Argo outputs, progress, `task_metric`.

`task_metric` is what a user's own evaluation code imports: it declares a function a config may name as a metric.

Nothing here imports hera or the authoring layer, so a step image needs only its runtime libraries. The same names
are in the flat `eksflow` namespace (loaded lazily, so importing them there stays as light).
"""

from eksflow.runtime.args import Location, Settings, StepArgs, StepFailedError, StepInputError, run_step
from eksflow.runtime.metrics import task_metric
from eksflow.runtime.outputs import Progress

__all__ = [
    "Location",
    "Progress",
    "Settings",
    "StepArgs",
    "StepFailedError",
    "StepInputError",
    "run_step",
    "task_metric",
]
