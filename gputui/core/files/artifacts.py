"""Artifacts: what a host's jobs leave on its disk that the user wants back before the host is released.

The patterns come from the host's ``artifacts`` setting and each job's ``run --artifacts``; a relative one
is looked for in every job's directory, an absolute (or ``~``) one on the host as it is. A file is *unpulled*
when the local pull record (``pulled.py``) does not hold its current size and mtime.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from gputui.core.config.file import HostConfig
from gputui.core.files import pulled
from gputui.core.files import wire as fileswire
from gputui.core.files.pull import Outcome, Progress, local_target, pull_planned, request_retrying
from gputui.core.files.wire import Remote, WireError
from gputui.core.session.host import HostSession
from gputui.core.transport.link import AgentError
from remote_agent import protocol as P

#: Most job directories one check looks into (a host with more jobs: the newest ones).
MAX_DIRS = 200
#: Where ``release --pull`` puts what it fetched: DIR/HOST/JOB/PATH (DIR/HOST/PATH for an absolute pattern).
DEFAULT_DEST = "gputui-artifacts"
#: Most patterns one job may name, and their length.
MAX_PATTERNS = 32
MAX_PATTERN_CHARS = 1024


@dataclass(frozen=True)
class Artifact:
    job: str | None  # the job whose directory holds it (None: an absolute pattern)
    remote: Remote

    @property
    def dest_rel(self) -> str:
        """Where it goes under the destination: JOB/PATH, or PATH."""
        return f"{self.job}/{self.remote.rel}" if self.job else self.remote.rel


@dataclass
class Check:
    """The host's artifacts not yet pulled, and what could not be looked at (then nothing is known safe)."""

    host: str
    unpulled: list[Artifact] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)

    @property
    def at_risk(self) -> bool:
        return bool(self.unpulled or self.problems)

    @property
    def bytes(self) -> int:
        return sum(a.remote.size for a in self.unpulled)

    def summary(self, limit: int = 5) -> str:
        """One line: how many files, how big, the first few names; and what could not be checked."""
        parts = []
        if self.unpulled:
            n = len(self.unpulled)
            names = ", ".join(a.dest_rel for a in self.unpulled[:limit])
            names += f" and {n - limit} more" if n > limit else ""
            size = f"{self.bytes / 1e6:,.1f} MB"
            files = f"{n} artifact file{'s' if n != 1 else ''}"
            parts.append(f"{files} ({size}) changed since the last pull: {names}")
        parts += [f"could not check artifacts: {p}" for p in self.problems[:limit]]
        return "; ".join(parts)


def check_patterns(items: list[str]) -> tuple[str, ...]:
    """``run --artifacts`` values (comma-separated or repeated) as patterns; ValueError naming a bad one."""
    out = [p.strip() for item in items for p in item.split(",") if p.strip()]
    for p in out:
        if len(p) > MAX_PATTERN_CHARS or any(ord(c) < 32 or ord(c) == 127 for c in p):
            raise ValueError(f"--artifacts {p[:60]!r}: not a path (too long or control characters)")
    if len(out) > MAX_PATTERNS:
        raise ValueError(f"--artifacts: at most {MAX_PATTERNS} patterns, not {len(out)}")
    return tuple(dict.fromkeys(out))


def _absolute(pattern: str) -> bool:
    return pattern.startswith(("/", "~"))


async def check(session: HostSession, host: HostConfig) -> Check:
    """The artifacts on the host whose current version was not pulled here (one listing per job dir)."""
    result = Check(host.name)
    jobs = await session.list_jobs()
    wanted: dict[tuple[str | None, str], list[str]] = {}  # (job, base) -> patterns
    for pattern in host.artifacts:
        if _absolute(pattern):
            wanted.setdefault((None, "~"), []).append(pattern)
    owner: dict[str, str] = {}  # a dir several jobs ran in: looked at once, its files filed under the newest
    for job in sorted(jobs, key=lambda j: j.started_at or 0.0, reverse=True):
        own = [p for p in job.record.get("artifacts") or () if isinstance(p, str)]
        for pattern in dict.fromkeys([*host.artifacts, *own]):
            if _absolute(pattern):
                wanted.setdefault((None, "~"), []).append(pattern)
            elif job.cwd:
                wanted.setdefault((owner.setdefault(job.cwd, job.id), job.cwd), []).append(pattern)
    if len(wanted) > MAX_DIRS:
        result.problems.append(f"more than {MAX_DIRS} job directories; only the newest were checked")
        wanted = dict(list(wanted.items())[:MAX_DIRS])
    record = pulled.load(host.name)
    seen: set[str] = set()
    for (job_id, base), patterns in wanted.items():
        unique = list(dict.fromkeys(patterns))
        try:
            res = await request_retrying(session, P.OP_FILES_LIST, base=base, patterns=unique, about=", ".join(unique))
            listed = fileswire.listing(session.name, res).files
        except (AgentError, WireError) as exc:  # nothing known safe there: the release is refused, saying why
            where = f"job {job_id}'s dir {base}" if job_id else base
            result.problems.append(f"{', '.join(unique)} in {where}: {exc}")
            continue
        for remote in listed:
            if remote.path in seen:
                continue
            seen.add(remote.path)
            if not pulled.is_fetched(record, remote.path, remote.size, remote.mtime):
                result.unpulled.append(Artifact(job_id, remote))
    return result


async def pull_artifacts(
    session: HostSession, arts: list[Artifact], dest: str, on_progress: Progress | None = None
) -> list[Outcome]:
    """Pull each artifact to DEST/HOST/[JOB/]PATH (never over a newer local file)."""
    base = f"{dest.rstrip('/') or '.'}/{session.name}"
    plan = [(a.remote, local_target(base, a.dest_rel)) for a in arts]
    return await pull_planned(session, plan, False, on_progress)
