"""eksflow's own kinds of resource object, each registered with its describer (resources.register_kind), in one place.

The handlers import this module, so every run knows them. A project adds a kind of its own the same way, with
`register_kind`; a run service's kinds are registered with the service (services.py).
"""

from __future__ import annotations

from eksflow.local import mpijob, trainjob
from eksflow.local.resources import (
    PODGROUP_GROUP,
    RAYJOB_API,
    VOLCANO_JOB_GROUP,
    describe_podgroup,
    describe_ray_job,
    describe_volcano_job,
    register_kind,
)

register_kind("RayJob", RAYJOB_API, describe_ray_job)
register_kind("PodGroup", PODGROUP_GROUP, describe_podgroup)
register_kind("MPIJob", mpijob.MPIJOB_API, mpijob.describe)
register_kind("Job", VOLCANO_JOB_GROUP, describe_volcano_job)
register_kind("TrainJob", trainjob.TRAINJOB_API, trainjob.describe)
