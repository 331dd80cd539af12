"""The Slurm launcher: the step as a Slurm batch job on Slinky (Slurm on EKS), submitted through slurmrestd.

`cluster.launcher: slurm` runs a distributed step as one Argo container task running eksflow.runtime.slurm_job:
it submits the job to `cluster.slurm.url` with the JWT of the mounted Secret `cluster.slurm.token_secret`, follows
it to its end (streaming its output into the task's log) and publishes the step's outputs as its own. The job
runs `python -m <step> --launcher=mpi ...` as srun tasks, a rank per device (GPU: `nodes` x the profile's
devices, `--gpus-per-node`; CPU: `train.num_workers` tasks on one node, or one task per node of several), on the
NodeSet's slurmd pods, which mount the same FSx file system; the ranks meet at the allocation's first node
(MASTER_ADDR), and across nodes gloo binds to the pods' eth0 (GLOO_SOCKET_IFNAME). Requeues happen inside
Slurm (a preempted or failed node's job runs again under the same id and the step resumes from its checkpoint;
the task's `slurm_requeues` output says how often and why, its progress is the step's);
the task's exit code follows the job's end (eksflow.runtime.slurm_job), so Argo's retry policy (all but 2) applies.

The job's ranks get, of the task's environment, the variables this launcher gives the task's container: the
profile's (HF_HUB_OFFLINE, EFA/NCCL) and the pipeline's `env` (config `env`, e.g. WANDB_PROJECT), named in
`--forward-env` (values stay in the container's env entries, never in argv). A credential is refused there: the
job's environment is kept in slurmctld's job record. The task also passes `--workflow-uid={{workflow.uid}}`:
the job's comment, which a retried task checks before it follows a running job instead of submitting one.

Locally the same task runs as a process against a real slurmrestd on 127.0.0.1 (`make slurm-up`, which writes the
token where the task's Secret is read: .eksflow/secrets/<token_secret>/token).
"""

from __future__ import annotations

from hera.workflows import Container, Env, Parameter, SecretVolume
from hera.workflows import models as m

from eksflow import profiles
from eksflow.cluster import cluster_of
from eksflow.config import PipelineConfig
from eksflow.errors import PipelineError
from eksflow.launchers.base import (
    Job,
    JobRequest,
    Launcher,
    attempt_deadline_s,
    node_layout,
    one_worker_per_node,
    register,
    worker_layout,
)
from eksflow.pipeline import Pipeline
from eksflow.profiles import Profile
from eksflow.refs import TaskRef
from eksflow.runtime.args import StepArgs, to_argv
from eksflow.runtime.shown import SECRET_ENV
from eksflow.runtime.slurm_job import REQUEUES_OUTPUT, JobArgs
from eksflow.templates import (
    FSX_VOLUME,
    OUTPUTS_DIR,
    PATH_ARGS_ANNOTATION,
    RESTRICTED,
    SMALL,
    arguments,
    contract,
    memoization,
    merged_metrics,
    path_annotation,
    retry,
    step_gauges,
    template_fingerprint,
)

TOKEN_DIR = "/etc/eksflow/slurm"  # the Secret's mount; its key `token` is the JWT
MAX_BATCH_REQUEUE = 5  # Slurm's default MaxBatchRequeue: how often slurmctld requeues a batch job by itself
ARGO_RETRIES = 1  # a new job after the first one ended retriably: Slurm already requeued that one itself
REFUSAL = (
    "cluster.launcher: slurm runs on GPU or CPU nodes; Trainium trains with torchrun in a Volcano Job; "
    "fix: --set cluster.launcher=rayjob"
)


class SlurmLauncher(Launcher):
    """A Slurm batch job through slurmrestd, followed by one container task."""

    name = "slurm"
    kinds = frozenset({"cpu", "gpu"})

    def refusal(self, profile: Profile) -> str | None:
        """Trainium nodes are not Slurm's here."""
        return REFUSAL if profile.kind == "trainium" else None

    def prepare(self, request: JobRequest) -> JobRequest:
        """Every srun task runs the step with `--launcher=mpi`: its Args need that field."""
        args_type, _ = contract(request.step)
        if "launcher" not in args_type.model_fields:
            raise PipelineError(
                f"distributed({request.step.__name__}): cluster.launcher=slurm runs it as `--launcher=mpi` srun "
                "tasks, and its Args have no `launcher` field; fix: add one taking 'mpi' (as eksflow.llm.steps.train "
                "has), or --set cluster.launcher=rayjob"
            )
        return one_worker_per_node(request) if request.profile.kind == "cpu" and request.cluster.nodes > 1 else request

    def admission(self, cfg: PipelineConfig) -> str:
        """Slurm's own scheduler allocates every node of the job at once (Kueue and Volcano are not involved)."""
        return "Slurm (the whole allocation at once)"

    def pods(self, cfg: PipelineConfig, job: Job) -> str:
        """The allocation, and where it is asked for."""
        slurm = cluster_of(cfg).slurm
        nodes, tasks = node_layout(cfg, job.profile, worker_layout(job.settings)[0])
        gpus = f", {job.profile.devices} GPUs each" if job.profile.kind == "gpu" else ""
        where = f"partition {slurm.partition or '(default)'}, time limit {slurm.time_limit_min or '(partition)'} min"
        return f"Slurm job: {nodes} node(s) x {tasks} srun task(s){gpus}; {where}; slurmrestd {slurm.api_version}"

    def attempts(self, cfg: PipelineConfig, job: Job) -> int:
        """(Argo's one retry of the task: a new job) x (Slurm's own requeues of a job, MaxBatchRequeue)."""
        return (ARGO_RETRIES + 1) * (MAX_BATCH_REQUEUE + 1)

    def add(self, request: JobRequest) -> TaskRef:
        """The container task running eksflow.runtime.slurm_job with the step's argv after `--`."""
        pipeline = Pipeline.current()
        cfg, name, step = request.cfg, request.task, request.step
        slurm = request.cluster.slurm
        args_type, outputs = contract(step)
        argv, inputs = arguments(args_type, name, [request.settings, *request.sections], request.values)
        workers, threads = worker_layout(request.settings)
        nodes, tasks = node_layout(cfg, request.profile, workers)
        env = {e["name"]: e["value"] for e in profiles.env(request.profile, nodes)} | dict(cfg.env)
        if secret := next((env_name for env_name in cfg.env if env_name in SECRET_ENV), None):
            raise PipelineError(
                f"env.{secret}: cluster.launcher=slurm gives the pipeline's env to the Slurm job, whose environment "
                "slurmctld keeps in its job record; a credential reaches the ranks only from a Secret: remove it"
            )
        own = {
            "url": slurm.url,
            "api_version": slurm.api_version,
            "user": slurm.user,
            "token_file": f"{TOKEN_DIR}/token",
            "job_name": f"{{{{workflow.name}}}}-{name}",
            "workflow_uid": "{{workflow.uid}}",
            "work_dir": f"{cfg.storage.fsx_mount}/runs/{{{{workflow.name}}}}/{name}/slurm",
            "partition": slurm.partition,
            "account": slurm.account,
            "qos": slurm.qos,
            "time_limit_min": slurm.time_limit_min,
            "nodes": nodes,
            "tasks_per_node": tasks,
            "cpus_per_task": threads,
            "gpus_per_node": request.profile.devices if request.profile.kind == "gpu" else 0,
            "forward_env": list(env),  # the names only: the job reads their values from this container's env
            "outputs_dir": OUTPUTS_DIR,  # the task's own: the step's outputs are copied here from the job's folder
        }
        args = [*to_argv(own), "--", step.__name__, *argv, "--launcher=mpi"]
        image = request.cluster.image
        fingerprint = template_fingerprint(step, image, args, request.memoize, pipeline.parameter_values)
        memo, memo_inputs = memoization(cfg, name, fingerprint, request.memoize)
        inputs = {**inputs, **memo_inputs}
        container = Container(
            name=name,
            image=image,
            command=["python", "-m", "eksflow.runtime.slurm_job"],
            args=args,
            inputs=[Parameter(name=arg) for arg in inputs] or None,
            outputs=[
                *(Parameter(name=o, value_from=m.ValueFrom(path=f"{OUTPUTS_DIR}/{o}")) for o in outputs),
                # the task's own: Slurm's requeues of the job, which a task that succeeded shows nowhere else
                Parameter(
                    name=REQUEUES_OUTPUT,
                    value_from=m.ValueFrom(path=f"{OUTPUTS_DIR}/{REQUEUES_OUTPUT}", default="none"),
                ),
            ],
            # Forwarded to the job's tasks by eksflow.runtime.slurm_job (--forward-env names them).
            env=[Env(name=env_name, value=value) for env_name, value in env.items()],
            volumes=[
                SecretVolume(
                    name=slurm.token_secret,
                    secret_name=slurm.token_secret,
                    default_mode=0o440,
                    mount_path=TOKEN_DIR,
                    read_only=True,
                )
            ],
            volume_mounts=[m.VolumeMount(name=FSX_VOLUME, mount_path=cfg.storage.fsx_mount)],
            resources=SMALL,
            retry_strategy=retry(ARGO_RETRIES, first_delay=cfg.retry.first_delay, max_delay=cfg.retry.max_delay),
            security_context=RESTRICTED,
            metrics=merged_metrics(step_gauges(cfg, step, name)),
            annotations=path_annotations(args_type),
            node_selector={profiles.CAPACITY_TYPE_LABEL: "on-demand"},  # it only follows the job: never lose it
            active_deadline_seconds=attempt_deadline_s(cfg),  # then the task's SIGTERM cancels the job
            memoize=memo,
        )
        return pipeline.add(
            name, container, step=step.__name__, outputs=outputs, inputs=inputs, after=request.after,
            when=request.when, fingerprint=fingerprint,
        )  # fmt: skip


def path_annotations(step_args: type[StepArgs]) -> dict[str, str]:
    """The path flags of both argv parts: the submitter's and the step's (the local executor maps them)."""
    flags = [
        part
        for annotation in (path_annotation(JobArgs), path_annotation(step_args))
        for part in annotation.get(PATH_ARGS_ANNOTATION, "").split(",")
        if part
    ]
    return {PATH_ARGS_ANNOTATION: ",".join(dict.fromkeys(flags))}


register(SlurmLauncher())
