"""Job use cases for both frontends: start a job with its price, collect jobs and history over hosts."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, cast

from gputui.core.config.file import Config, HostConfig
from gputui.core.money.cost import price_per_hour
from gputui.core.session import model as M
from gputui.core.session.gather import Fleetish, Outcome, gather_hosts
from gputui.core.session.host import HostSession
from remote_agent import protocol as P
from remote_agent.jobs import image as agent_image
from remote_agent.jobs import restart as restart_policy


@dataclass(frozen=True)
class JobSpec:
    """What the user asked to run: argv (never a shell string), where and with which GPUs."""

    host: str
    argv: list[str]
    name: str | None = None
    cwd: str | None = None
    env: Mapping[str, str] = field(default_factory=dict)
    gpus: str | None = None
    code: dict[str, Any] | None = None  # what code runs (gputui run --sync): tree hash, git commit, dirty
    queue: dict[str, Any] | None = None  # wait in the host's queue: gpus, after, after_ok (remote_agent/jobs/queue.py)
    artifacts: tuple[str, ...] = ()  # files to bring back before release (gputui run --artifacts)
    sync: str | None = None  # a local dir to sync to the host first (into cwd); the job then runs there
    slurm: dict[str, Any] | None = None  # sbatch settings (gpus, nodes, partition, time, sbatch_args)
    restart: str | None = None  # "no" / "on-failure[:N]"; None: the host's default (remote_agent/jobs/restart.py)
    resume_from: str | None = None  # checkpoint glob inside the job's dir: GPUTUI_RESUME_FROM of each restart
    # variables whose values never rest in a record (gputui/core/jobs/secrets.py); never shown, not even in a repr
    secrets: Mapping[str, str] = field(default_factory=dict, repr=False)
    image: str | None = None  # run in a container of this image (remote_agent/jobs/image.py)
    build: str | None = None  # or of an image built on the host from this Dockerfile in the job's dir
    docker_args: tuple[str, ...] = ()  # extra engine options for it, each one option with its value joined by =
    group: P.GroupRequest | None = field(default=None, repr=False)  # one part of a job over several hosts (its key)


def parse_env(items: Iterable[str], label: str = "env") -> dict[str, str]:
    """``KEY=VALUE`` items as a dict (a later key wins); ValueError naming the first item that is not one."""
    env: dict[str, str] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key:
            shown = item if len(item) <= 60 else item[:59] + "…"
            raise ValueError(f"{label} {shown!r}: expected KEY=VALUE")
        env[key] = value
    return env


def inventory(session: HostSession) -> tuple[M.GpuSample, ...]:
    """The host's GPUs as its agent reported them when the link came up."""
    return tuple(M.GpuSample.from_wire(g) for g in session.snapshot.facts.get("gpus") or ())


def job_price(session: HostSession, config: Config) -> float | None:
    """What the host costs per hour now (its own price, else its GPUs' prices); None when unknown."""
    host = config.hosts.get(session.name)
    return None if host is None else price_per_hour(host, inventory(session), config.prices)


async def start_job(session: HostSession, config: Config, spec: JobSpec) -> M.Job:
    """Start ``spec`` on the session's host; the job's record keeps the host's price, so history has its cost.
    On a Slurm host (``scheduler = "slurm"``) the job is submitted with sbatch, with ``spec.slurm`` or defaults."""
    host = config.hosts.get(session.name)
    slurm = spec.slurm if spec.slurm is not None or host is None or host.scheduler != "slurm" else {}
    price = job_price(session, config)
    if slurm is not None and host is not None and host.price_per_gpu_hour is not None:
        price = host.price_per_gpu_hour * slurm.get("gpus", 0) * slurm.get("nodes", 1)  # what the job holds
    return await session.start_job(
        list(spec.argv), name=spec.name, cwd=spec.cwd, env=dict(spec.env),
        gpus=None if slurm is not None or spec.queue is not None else spec.gpus, price_per_hour=price,
        code=spec.code, artifacts=spec.artifacts, slurm=slurm,
        queue=None if spec.queue is None else queue_request(spec.queue, idle_util(config, session.name)),
        restart=restart_request(config, session.name, spec.restart, spec.resume_from), secrets=dict(spec.secrets),
        container=container_request(spec, host), group=spec.group,
    )


def container_request(spec: JobSpec, host: HostConfig | None) -> P.ContainerRequest | None:
    """The ``container`` a start sends for ``spec.image`` (None: a bare job); ValueError for a bad image or
    engine option (remote_agent/jobs/image.py has the rules, the host checks them again)."""
    if spec.image is not None and spec.build is not None:
        raise ValueError("--image or --build: a job runs in one image")
    if spec.image is None and spec.build is None:
        if spec.docker_args:
            raise ValueError("--docker-arg needs --image or --build: the engine options of a job run in an image")
        return None
    request: P.ContainerRequest = {"args": list(spec.docker_args),
                                   "engine": host.container_engine if host is not None else "auto"}
    if spec.build is not None:
        request["build"] = {"dockerfile": spec.build}
    else:
        request["image"] = str(spec.image)
    return agent_image.check_request(request)  # type: ignore[return-value]


def check_restart(policy: str | None, resume_from: str | None) -> None:
    """ValueError for a bad restart policy, or a ``resume_from`` glob that reaches outside the job's dir or
    comes without a policy that restarts (None: no policy)."""
    asked = restart_policy.parse_policy(policy) if policy is not None else None
    if resume_from is not None:
        restart_policy.check_glob(resume_from)
        if asked is None or asked["policy"] == restart_policy.POLICY_NO:
            raise ValueError("resume from needs a restart policy: on-failure or on-failure:N")


def restart_request(config: Config, name: str, policy: str | None, resume_from: str | None) -> dict[str, Any] | None:
    """The ``restart`` a start sends: ``policy`` (else the host's ``restart``) with the host's backoff settings;
    None for ``no``. ValueError for a bad policy or a glob reaching outside the job's dir."""
    host = config.hosts.get(name)
    asked = restart_policy.parse_policy(policy if policy is not None else host.restart if host is not None else "no")
    if resume_from is not None:
        restart_policy.check_glob(resume_from)
    if asked["policy"] == restart_policy.POLICY_NO:
        if resume_from is not None:
            raise ValueError("--resume-from needs a restart policy: add --restart on-failure")
        return None
    if host is not None:
        asked.update(backoff_s=host.restart_backoff_s, backoff_max_s=host.restart_backoff_max_s,
                     healthy_s=host.restart_healthy_minutes * 60.0)
    if resume_from is not None:
        asked["resume_from"] = resume_from
    return asked


#: Job ids a queued job may wait for, per flag (``--after``, ``--after-ok``).
MAX_QUEUE_DEPS = P.MAX_QUEUE_DEPS


def queue_request(asked: Mapping[str, Any], idle_util_percent: float) -> P.QueueRequest:
    """What the host's queue is asked: ``asked`` (gpus or gpu_count, after, after_ok) with the idle threshold."""
    return cast(P.QueueRequest, {**asked, "idle_util_percent": idle_util_percent})


def idle_util(config: Config, name: str) -> float:
    """The host's idle threshold (%): a GPU at or above it is busy, for autostop and for the queue alike."""
    host = config.hosts.get(name)
    return host.idle_util_percent if host is not None else 5.0


async def collect_jobs(
    fleet: Fleetish, names: list[str], ended_only: bool = False, connect: bool = True
) -> tuple[list[M.Job], dict[str, BaseException]]:
    """Every job of the named hosts with insights from its log tail; (jobs, errors by host). The insights
    of ended jobs are kept in the user's cache dir (``insights_cache``), so their tails are read once.

    ``connect``: start each session first (the CLI); the app's sessions are connected already.
    """
    from gputui.core.jobs.insights_cache import InsightsCache
    from gputui.core.jobs.records import (
        with_insights,  # log parsing: only the commands that show insights load it
    )

    cache = InsightsCache()

    async def collect(s: HostSession) -> list[M.Job]:
        jobs = [j for j in await s.list_jobs() if not ended_only or j.state in M.JOB_ENDED_STATES]
        return await with_insights(s, jobs, cache)

    results: dict[str, Outcome[list[M.Job]]] = await gather_hosts(fleet, names, collect, connect=connect)
    jobs = [job for res in results.values() if not isinstance(res, BaseException) for job in res]
    return jobs, {n: r for n, r in results.items() if isinstance(r, BaseException)}


def host_currency(config: Config, name: str) -> str:
    host = config.hosts.get(name)
    return (host.currency if host is not None else None) or config.currency


async def collect_history(
    fleet: Fleetish, config: Config, names: list[str], connect: bool = True
) -> tuple[list[dict[str, Any]], dict[str, BaseException]]:
    """Finished runs of the named hosts, newest first, as history records; (records, errors by host)."""
    from gputui.core.jobs.group import merge_records
    from gputui.core.jobs.records import run_record

    jobs, errors = await collect_jobs(fleet, names, ended_only=True, connect=connect)
    records = merge_records([run_record(j, j.insights, host_currency(config, j.host)) for j in jobs])
    records.sort(key=lambda r: r["ended_at"] or 0.0, reverse=True)
    return records, errors
