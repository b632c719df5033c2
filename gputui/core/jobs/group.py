"""A job over several SSH hosts (``gputui run h1,h2 ...``): which hosts, the check of every host before any part
starts, the all-or-nothing start, and the one job the lists, ``kill`` and ``logs`` show for its parts.

The parts then live without the client: the hosts' agents run them and rank 0's hub stops them all when one fails
or is lost (remote_agent/jobs/group.py).
"""

from __future__ import annotations

import asyncio
import dataclasses
import secrets
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, cast

from gputui.core import safetext
from gputui.core.config.file import Config
from gputui.core.session import model as M
from gputui.core.session.gather import Fleetish
from gputui.core.session.host import HostSession
from remote_agent import protocol as P
from remote_agent.jobs import group as agent_group

ENV_NAMES = agent_group.ENV_NAMES


class GroupError(ValueError):
    """A job over several hosts that cannot start as asked (nothing was started)."""


def hosts_of(config: Config, spec: str) -> list[str] | None:
    """The hosts ``spec`` names when it names several (``h1,h2`` or a ``[groups.NAME]``); None for one host.
    GroupError for a host named twice, an unknown host or a Slurm host among them."""
    if spec in config.groups:
        names = list(config.groups[spec])
    elif "," in spec:
        names = [n.strip() for n in spec.split(",")]
    else:
        return None
    if any(not n for n in names):
        raise GroupError(f"{spec!r}: an empty host name in the list")
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
        raise GroupError(f"{spec!r}: {', '.join(twice)} named twice (one part per host)")
    for name in names:
        host = config.host(name)  # a ConfigError naming the known hosts
        if host.scheduler is not None:
            raise GroupError(
                f"{name} is a Slurm cluster: run a many-node job there with --nodes N, not with other hosts"
            )
    if len(names) > agent_group.MAX_NODES:
        raise GroupError(f"{spec!r}: at most {agent_group.MAX_NODES} hosts")
    return names


@dataclass(frozen=True)
class Plan:
    """What every part is told: the hosts in rank order, processes per node, the rendezvous, the hub's key."""

    id: str
    hosts: tuple[str, ...]
    nproc_per_node: int
    master_addr: str
    addr_from: str  # how MASTER_ADDR was found, in words
    master_port: int
    hub_port: int
    launcher: str | None
    key: str = dataclasses.field(repr=False)
    lost_s: float = agent_group.LOST_S

    def request(self, rank: int) -> P.GroupRequest:
        return {"id": self.id, "hosts": list(self.hosts), "rank": rank, "nproc_per_node": self.nproc_per_node,
                "master_addr": self.master_addr, "master_port": self.master_port, "hub_port": self.hub_port,
                "lost_s": self.lost_s, "launcher": self.launcher, "key": self.key}


def master_address(config: Config, first: str, checks: Mapping[str, Mapping[str, Any]]) -> tuple[str, str]:
    """(MASTER_ADDR, how it was found): the first host's ``private_address``; else the address its routes send
    from to the others; else the address its SSH server answered on; else its configured address."""
    host = config.host(first)
    if host.private_address:
        return host.private_address, f"private_address of {first}"
    own = checks[first].get("address")
    routes = checks[first].get("routes") or {}
    sources = {
        src for peer, src in routes.items() if src and src != peer
    }  # src == peer: the peer is this machine
    if len(sources) == 1:
        return next(iter(sources)), f"{first}'s route to the other hosts"
    if own:
        return own, f"the address {first}'s SSH server answered on"
    return host.address, f"{first}'s address in the config"


def processes_per_node(hosts: Sequence[str], counts: Sequence[int], gpus_per_node: int | None) -> int:
    """torchrun's processes per node: ``--gpus-per-node`` (every host must have as many GPUs), else every
    host's GPU count when they agree (1 on hosts without GPUs); GroupError naming the hosts that disagree."""
    if gpus_per_node:
        short = [f"{h} has {c}" for h, c in zip(hosts, counts, strict=True) if c < gpus_per_node]
        if short:
            raise GroupError(f"--gpus-per-node {gpus_per_node}: {', '.join(short)} GPU(s)")
        return gpus_per_node
    if len(set(counts)) > 1:
        have = ", ".join(f"{h}: {c}" for h, c in zip(hosts, counts, strict=True))
        raise GroupError(f"the hosts have different GPU counts ({have}): give --gpus-per-node G")
    return counts[0] or 1


def _checked(answer: dict[str, Any]) -> dict[str, Any]:
    """A host's ``jobs.group_check`` answer with every field of the type it must have (a field that is not:
    empty), its words made safe to show."""
    def port(p: Any) -> bool:
        return isinstance(p, int) and not isinstance(p, bool) and 0 < p < 65536

    address = answer.get("address")
    problems, ports, routes = answer.get("problems"), answer.get("ports"), answer.get("routes")
    count = answer.get("gpu_count")
    return {
        "address": address if isinstance(address, str) and agent_group.ADDRESS.match(address) else None,
        "gpu_count": count if isinstance(count, int) and not isinstance(count, bool) and count >= 0 else 0,
        "problems": [safetext.clean(p, limit=300) for p in problems[:20]] if isinstance(problems, list) else [],
        "ports": [p for p in ports if port(p)] if isinstance(ports, list) else [],
        "routes": {k: v for k, v in routes.items() if isinstance(v, str) and agent_group.ADDRESS.match(v)}
        if isinstance(routes, dict) else {},
    }


async def check(
    sessions: Mapping[str, HostSession], config: Config, argv: Sequence[str], cwds: Mapping[str, str | None],
    path: str | None, launcher: str | None, gpus_per_node: int | None, in_image: bool = False,
) -> Plan:
    """Check every host (connected) before any part starts: the job's dir, the command and the script (not
    for a job in an image: they are in the image), the GPUs; pick the rendezvous on the first. GroupError
    listing every host's problem."""
    hosts = list(sessions)

    async def one(name: str, first: bool, peers: list[str]) -> dict[str, Any]:
        args: dict[str, Any] = {
            "argv": [] if in_image else list(argv)[:2],
            "cwd": cwds.get(name),
            "path": path,
            "launcher": launcher,
        }
        if first:
            args.update(ports=True, peers=peers)
        return _checked(dict(await sessions[name].group_check(**args)))

    others = await asyncio.gather(*(one(n, False, []) for n in hosts[1:]))
    peers = [r["address"] for r in others if r["address"]]
    checks = dict(zip(hosts, [await one(hosts[0], True, peers), *others], strict=True))
    problems = [f"{name}: {p}" for name, r in checks.items() for p in r["problems"]]
    if problems:
        raise GroupError("cannot start on every host:\n  " + "\n  ".join(problems))
    nproc = processes_per_node(hosts, [checks[n]["gpu_count"] for n in hosts], gpus_per_node)
    ports = checks[hosts[0]]["ports"]
    if len(ports) != 2:
        raise GroupError(f"{hosts[0]} found no free port for the rendezvous")
    addr, addr_from = master_address(config, hosts[0], checks)
    return Plan(secrets.token_hex(6), tuple(hosts), nproc, addr, addr_from, int(ports[0]), int(ports[1]), launcher,
                secrets.token_hex(32))


# --- the parts as one job ---------------------------------------------------------------------------------------
def group_of(job: M.Job) -> dict[str, Any] | None:
    """The ``group`` of a part of a job over several hosts (None for a job of one host)."""
    group: Any = job.record.get("group")
    return group if isinstance(group, dict) and isinstance(group.get("id"), str) else None


def _combined_state(parts: Sequence[dict[str, Any]]) -> P.JobState:
    """Running while a part runs; else failed when one failed or was lost, killed when one was killed;
    succeeded when all did."""
    states = [p.get("state") for p in parts]
    state: P.JobState
    if M.JOB_RUNNING in states:
        state = M.JOB_RUNNING
    elif M.JOB_FAILED in states or M.JOB_LOST in states:
        state = M.JOB_FAILED
    elif M.JOB_KILLED in states:
        state = M.JOB_KILLED
    elif states and all(s == M.JOB_SUCCEEDED for s in states):
        state = M.JOB_SUCCEEDED
    else:
        state = M.JOB_QUEUED if M.JOB_QUEUED in states else M.JOB_LOST
    return state


def merge_parts(jobs: Sequence[M.Job]) -> list[M.Job]:
    """The jobs with each job over several hosts as one: rank 0's part (else the lowest rank listed) with the
    whole's state, its ``group.parts`` (host, rank, id, state, exit, error; ``unknown`` for a host that did not
    answer) and the error of the part that ended failing first."""
    parts: dict[str, list[M.Job]] = {}
    for job in jobs:
        group = group_of(job)
        if group is not None:
            parts.setdefault(group["id"], []).append(job)
    out, done = [], set()
    for job in jobs:
        group = group_of(job)
        if group is None:
            out.append(job)
            continue
        if group["id"] in done:
            continue
        done.add(group["id"])
        mine = sorted(parts[group["id"]], key=lambda j: (group_of(j) or {}).get("rank", 0))
        by_rank = {(group_of(j) or {}).get("rank"): j for j in mine}
        listed = []
        for rank, host in enumerate(group.get("hosts") or ()):
            part = by_rank.get(rank)
            listed.append({"rank": rank, "host": host, "id": part.id if part else None,
                           "state": part.state if part else "unknown", "exit_code": part.exit_code if part else None,
                           "error": part.record.get("error") if part else None,
                           "ended_at": part.ended_at if part else None})
        known = [p for p in listed if p["state"] != "unknown"]
        state = _combined_state(known)
        failed = sorted((p for p in known if p["state"] in (M.JOB_FAILED, M.JOB_LOST, M.JOB_KILLED)),
                        key=lambda p: p["ended_at"] or float("inf"))  # the first to end: the cause
        first = next((p for p in failed if not str(p.get("error") or "").startswith("stopped: ")), None)
        first = first or (failed[0] if failed else None)
        lead = mine[0]
        record = dict(lead.record, group=dict(group, parts=listed))
        if first is not None:  # the job's error is the cause, not a part stopped because of it
            said = f"{first['host']} (rank {first['rank']}) {first['state']} (exit {first['exit_code']})"
            record["error"] = str(first.get("error") or said)
        ends = [j.ended_at for j in mine]
        out.append(dataclasses.replace(
            lead, state=state, exit_code=first["exit_code"] if first else lead.exit_code,
            started_at=min((j.started_at for j in mine if j.started_at is not None), default=None),
            ended_at=None if state == M.JOB_RUNNING or None in ends else max(e for e in ends if e is not None),
            record=cast(P.JobRecord, record),
        ))
    return out


def merge_records(records: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """History records with each job over several hosts as one: rank 0's record, the summed cost and every
    part's host, GPUs, cost and end in ``parts``."""
    groups: dict[str, list[dict[str, Any]]] = {}
    for r in records:
        if isinstance(r.get("group"), dict):
            groups.setdefault(r["group"]["id"], []).append(r)
    out = []
    for r in records:
        group = r.get("group")
        if not isinstance(group, dict):
            out.append(r)
            continue
        mine = groups.pop(group["id"], None)
        if mine is None:
            continue  # merged already
        mine.sort(key=lambda x: x["group"].get("rank", 0))
        costs = [x["cost"] for x in mine if x.get("cost") is not None]
        summed = {key: [x[key] for x in mine if x.get(key) is not None] for key in ("cost_idle_or_throttled", "cost_narrow_link", "energy_kwh")}
        parts = [{"host": x["host"], "id": x["id"], "rank": x["group"].get("rank"), "state": x["state"],
                  "exit_code": x["exit_code"], "gpus": x["gpus"], "cost": x.get("cost")} for x in mine]
        faults = [dict(f, host=x["host"]) for x in mine for f in x.get("gpu_faults") or []]
        lead = dict(mine[0], cost=sum(costs) if costs else None, group=dict(group, parts=parts),
                    gpu_faults=faults, **{key: sum(v) if v else None for key, v in summed.items()})
        lead["ended_at"] = max((x["ended_at"] for x in mine if x.get("ended_at") is not None), default=None)
        lead["thermal_slowdown_s"] = max((x["thermal_slowdown_s"] for x in mine if x.get("thermal_slowdown_s") is not None),
                                         default=None)  # the parts ran at the same time: the longest
        out.append(lead)
    return out


async def find_parts(fleet: Fleetish, job: M.Job) -> dict[int, tuple[str, M.Job | BaseException]]:
    """Each part of ``job`` (any of its parts) by rank: (host, its job there, or why it cannot be found)."""
    group = group_of(job)
    if group is None:
        return {0: (job.host, job)}
    hosts = list(group.get("hosts") or ())

    async def look(name: str) -> M.Job:
        s = fleet.session(name)
        if s.link is None:
            await s.start()
        for j in await s.list_jobs():
            g = group_of(j)
            if g is not None and g["id"] == group["id"]:
                return j
        raise LookupError(
            f"no part of this job on {name} (its jobs there were deleted, or it is another host now)"
        )

    found = await asyncio.gather(*(look(n) for n in hosts), return_exceptions=True)
    return {rank: (host, res) for rank, (host, res) in enumerate(zip(hosts, found, strict=True))}


async def kill_parts(fleet: Fleetish, job: M.Job, grace_s: float) -> list[tuple[str, M.Job | BaseException]]:
    """Kill every part still running (SIGINT, TERM, KILL on each host, all at once); (host, result) by rank."""
    parts = await find_parts(fleet, job)

    async def kill(host: str, part: M.Job | BaseException) -> M.Job | BaseException:
        if isinstance(part, BaseException) or part.state in M.JOB_ENDED_STATES:
            return part
        try:
            return await fleet.session(host).kill_job(part.id, grace_s)
        except Exception as exc:  # one host's failure is said, the others are still killed
            return exc

    results = await asyncio.gather(*(kill(h, p) for h, p in parts.values()))
    return [(host, res) for (host, _), res in zip(parts.values(), results, strict=True)]
