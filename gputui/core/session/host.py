"""HostSession: one host's connection, state and subscriptions, kept alive across link drops."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any, cast

from gputui.core.session import model as M
from gputui.core.session.metrics_history import MetricsHistory, MetricsRing
from gputui.core.transport.base import (
    AgentChannel,
    FileStates,
    HostError,
    HostUnavailable,
    Transport,
    fix_files,
)
from gputui.core.transport.link import AgentError, ByteReader, Link, LinkClosed, RequestTimeout
from remote_agent import protocol as P

if TYPE_CHECKING:
    from gputui.core.session.series import JobSeries

log = logging.getLogger(__name__)

HISTORY_SAMPLES = 600  # ten minutes at 1 Hz
PING_EVERY_S = 5.0
#: How often a connected app asks a Slurm login node for its partitions and nodes (one sinfo each time).
CLUSTER_EVERY_S = 10.0
SILENCE_S = 15.0  # nothing at all from the agent this long (it heartbeats every second): it hangs
MAX_KILL_GRACE_S = P.MAX_KILL_GRACE_S  # the agent refuses a longer grace between kill signals
RETRY_CONNECT_S = 10.0  # ``ensure_connected``: a host whose connect failed is tried again at most this often
FIX_LOOK_S = 2.0  # a host refused for a file of the user's (known_hosts): how often the app looks at it
#: Connect failures worth another try; HostError (auth, host key, missing python3/tmux) is not one.
RETRYABLE = (HostUnavailable, LinkClosed, AgentError, OSError, asyncio.TimeoutError)
#: A follow this far behind the log's end catches up over a raw stream (the agent's ``cat`` on a channel of
#: its own: no JSON, no base64) before it follows on the agent channel.
CATCHUP_MIN_BYTES = 4 * 1024 * 1024
CATCHUP_READ = 1024 * 1024
#: Raw streams in a row that may fail without a byte before the follow goes on over the agent channel.
CATCHUP_TRIES = 3


@dataclass(frozen=True)
class LogTail:
    """The end of one job's log (``logs.tails``): bytes from ``offset``, and when they were written."""

    offset: int
    data: bytes
    size: int
    times: list[tuple[int, float]]
    error: str | None = None  # this job's log cannot be read (the rest is empty)


def _log_tail(tail: dict[str, Any]) -> tuple[str, LogTail]:
    """(job id, LogTail) of one entry of a ``logs.tails`` reply."""
    if "error" in tail:
        return str(tail.get("job")), LogTail(0, b"", 0, [], str(tail["error"]))
    times = [(int(o), float(t)) for o, t in tail.get("times") or ()]
    data = P.unb64(tail.get("b64") or "")
    return str(tail.get("job")), LogTail(int(tail["offset"]), data, int(tail["size"]), times)


@dataclass
class LogFollow:
    """A followed log. ``cursor`` counts the bytes received from complete frames: reconnects resume there."""

    job: str
    cursor: int
    on_data: Callable[[bytes], None]
    on_gap: Callable[[str], None]
    on_end: Callable[[dict[str, Any]], None]
    ended: bool = False
    catchup: asyncio.Task[None] | None = None  # a raw-stream catch-up runs; the agent does not follow yet
    starting: bool = False  # _start_follow is asking the agent about this follow
    stream_failures: int = 0  # raw streams in a row that brought no byte
    pace: Callable[[], Awaitable[None]] | None = None  # awaited after each raw-stream chunk: the reader's flow control


class _HeardReader:
    """A stream channel's reader that notes when bytes arrive: they prove the host's connection alive."""

    def __init__(self, reader: ByteReader, heard: Callable[[], None]) -> None:
        self._reader, self._heard = reader, heard

    async def read(self, n: int) -> bytes:
        data = await self._reader.read(n)
        if data:
            self._heard()
        return data

    async def readline(self) -> bytes:
        line = await self._reader.readline()
        if line:
            self._heard()
        return line


class Backoff:
    """Capped exponential backoff with full jitter."""

    def __init__(self, base: float = 0.5, cap: float = 30.0) -> None:
        self.base, self.cap, self.attempt = base, cap, 0

    def next_delay(self) -> float:
        self.attempt += 1
        ceiling: float = min(self.cap, self.base * 2 ** (self.attempt - 1))
        return ceiling / 2 + random.uniform(0, ceiling / 2)

    def reset(self) -> None:
        self.attempt = 0


class HostSession:
    """Owns the Link to one host's agent and turns its frames into HostSnapshots.

    ``start()`` connects once (raising on failure); ``run()`` keeps the host connected, reconnecting with
    backoff, re-subscribing metrics and resuming every followed log from its cursor.
    """

    def __init__(
        self,
        name: str,
        transport: Transport,
        on_change: Callable[[M.HostSnapshot], None] | None = None,
        metrics_interval: float | None = None,
        sample_args: dict[str, Any] | None = None,
        on_connect: Callable[[HostSession], Awaitable[None]] | None = None,
        scheduler: str | None = None,
    ) -> None:
        self.name, self.transport = name, transport
        self.on_change = on_change
        self.metrics_interval = metrics_interval
        self.sample_args = sample_args or {}  # the idle rule: idle_util_percent, count_sessions
        self.on_connect = on_connect  # e.g. arm the autostop watchdog after every (re)connect
        self.autostart: dict[str, Any] | None = None  # resume_on_boot's crontab line, as the last arming found it
        self.link: Link | None = None
        self._channel: AgentChannel | None = None
        self._snapshot = M.HostSnapshot(name=name)
        self._jobs: dict[str, M.Job] = {}
        self._jobs_changed = False  # the snapshot's sorted jobs tuple is rebuilt only after a job changed
        self._history = MetricsRing(HISTORY_SAMPLES)
        self._follows: dict[str, LogFollow] = {}
        self._connected = asyncio.Event()
        self._closing = False
        self._runner: asyncio.Task[None] | None = None
        self._connecting: asyncio.Task[None] | None = None  # ``ensure_connected``'s connect, while it runs
        # (monotonic time, error, the state of the files that may fix it) of its last failure
        self._connect_failed: tuple[float, BaseException, FileStates] | None = None
        self._wake = asyncio.Event()  # set: the next reconnect now, not after its backoff (``reconnect_now``)
        self._pinger: asyncio.Task[None] | None = None
        self._stream_rx = 0.0  # loop time when a stream channel (catch-up, pull, sync) last brought bytes
        self.scheduler = scheduler  # "slurm": a login node; with metrics on, its cluster view is kept fresh
        self._cluster_task: asyncio.Task[None] | None = None

    # --- state ------------------------------------------------------------------------------------------------
    @property
    def snapshot(self) -> M.HostSnapshot:
        return self._snapshot

    @property
    def history(self) -> MetricsHistory:
        return self._history.view

    def _publish(self, **changes: Any) -> None:
        if self._jobs_changed:
            self._jobs_changed = False
            changes["jobs"] = tuple(
                sorted(self._jobs.values(), key=lambda j: int(j.id) if j.id.isdigit() else 0)
            )
        self._snapshot = replace(self._snapshot, updated_at=time.time(), **changes)
        if self.on_change is not None:
            self.on_change(self._snapshot)

    def _set_job(self, data: dict[str, Any]) -> None:
        job = M.Job.from_wire(self.name, cast(P.JobRecord, data))  # the agent ships with this client
        self._jobs[job.id] = job
        self._jobs_changed = True

    def _on_event(self, name: str, data: Any) -> None:
        if name == P.EV_METRICS and isinstance(data, dict) and data.get("seq") is not None:
            self._add_sample(data)
            self._publish()
        elif name == P.EV_JOB and isinstance(data, dict):
            self._set_job(data)
            self._publish()
        elif name == P.EV_LOG and isinstance(data, dict):
            self._on_log(data)
        elif name == P.EV_LOG_END and isinstance(data, dict):
            follow = self._follows.get(str(data.get("job")))
            if follow is not None and follow.catchup is None and int(data.get("offset", -1)) == follow.cursor:
                follow.ended = True
                self._follows.pop(follow.job, None)
                follow.on_end(data)

    def _add_sample(self, data: dict[str, Any]) -> M.MetricsSample:
        sample = M.MetricsSample.from_wire(cast(P.MetricsSample, data))
        seq, t = self._history.view.last_seq, self._history.view.last_t
        if seq is not None and t is not None and sample.seq <= seq and sample.t <= t:
            return sample  # already have it (backlog overlap)
        self._snapshot = replace(self._snapshot, metrics=sample, history=self._history.append(sample))
        return sample

    def _on_log(self, data: dict[str, Any]) -> None:
        follow = self._follows.get(str(data.get("job")))
        if follow is None or follow.catchup is not None:
            return
        offset = int(data["offset"])
        if data.get("error"):  # the log cannot be read now (a dir, a FIFO, EIO...): the agent retries
            follow.on_gap(f"log unreadable: {data['error']}")
            return
        if data.get("reset"):
            follow.cursor = offset  # first: the gap's handler may ask where the follow goes on (``log_cursor``)
            follow.on_gap(
                f"log {data['reset']}: bytes from {data.get('lost_from')} on are gone; restarting at 0"
            )
            return
        chunk = P.unb64(data.get("b64", ""))
        if offset > follow.cursor:
            follow.on_gap(f"{offset - follow.cursor} bytes missing before offset {offset}")
        elif offset < follow.cursor:  # overlap after a resume: drop what we already have
            chunk = chunk[follow.cursor - offset :]
            offset = follow.cursor
        if chunk:
            follow.cursor = offset + len(chunk)
            follow.on_data(chunk)

    # --- connection -------------------------------------------------------------------------------------------
    async def _connect(self) -> None:
        channel = await self.transport.open_agent()
        link = Link(channel.reader, channel.writer, self._on_event)
        try:
            hello = await link.start()
        except LinkClosed as exc:
            await channel.close()
            detail = channel.stderr_text()
            raise HostUnavailable(f"agent did not start: {detail or exc}") from None
        if isinstance(hello.get("error"), dict):  # e.g. a state dir that is not ours alone
            await link.close()
            await channel.close()
            raise HostError(str(hello["error"].get("message")), str(hello["error"].get("code") or "agent"))
        if hello.get("protocol") != P.PROTOCOL_VERSION:
            await link.close()
            await channel.close()
            raise HostError(
                f"the agent on {self.name} speaks protocol {str(hello.get('protocol'))[:20]}, this gputui "
                f"{P.PROTOCOL_VERSION} (agent build {str(hello.get('build'))[:40]}): it is not this gputui's "
                "build; nothing was done on the host",
                "protocol",
            )
        self.link, self._channel = link, channel
        self._publish(state=M.CONNECTED, error=None, detail=None, facts=hello.get("host") or {})
        await self._fetch_jobs(link.request)
        if self.metrics_interval is not None:
            since = self._history.view.last_seq
            res = await link.request(
                P.OP_METRICS_SUBSCRIBE, interval=self.metrics_interval, since_seq=since, **self.sample_args
            )
            for sample in res.get("backlog") or ():
                self._add_sample(sample)
        for follow in list(self._follows.values()):
            await self._start_follow(link, follow)
        if self.on_connect is not None:
            await self.on_connect(self)
        self._publish()
        self._connected.set()
        self._pinger = asyncio.create_task(self._ping_loop(link))
        if self.scheduler == "slurm" and self.metrics_interval is not None:
            self._cluster_task = asyncio.create_task(self._cluster_loop())

    async def _fetch_jobs(self, request: Callable[..., Awaitable[Any]]) -> None:
        """Every job's record, page by page (one reply must stay small however many jobs the host has)."""
        after = 0
        while True:
            page = await request(P.OP_JOBS_LIST, after=after)
            for job in page["jobs"]:
                self._set_job(job)
            if not page.get("more") or not page["jobs"]:
                return
            after = int(page["jobs"][-1]["id"])

    async def _ping_loop(self, link: Link) -> None:
        """Keep the agent from timing out (it must hear us), and notice an agent that has gone silent.

        Silence is judged by any bytes arriving (the agent sends a heartbeat every second), never by the
        ping's reply: on a slow link that reply may queue behind log data. Bytes on a stream channel of the
        same connection count too: on a slow link a catch-up or pull crowds the heartbeats out for as long as
        it runs. A dead link is for SSH keepalive.
        """
        loop = asyncio.get_running_loop()
        with contextlib.suppress(LinkClosed, AgentError):
            while not link.closed.is_set():
                await asyncio.sleep(PING_EVERY_S)
                silent = min(link.silent_for(), loop.time() - self._stream_rx)
                if silent > SILENCE_S:  # a hung agent: reconnect
                    await link.close(f"the agent sent nothing for {silent:.0f} s")
                    return
                with contextlib.suppress(RequestTimeout):
                    await link.request(P.OP_PING, timeout=PING_EVERY_S)

    async def _cluster_loop(self) -> None:
        """Refresh the Slurm cluster view while connected (sinfo's own failures come back in its ``error``)."""
        with contextlib.suppress(LinkClosed, AgentError, RequestTimeout):
            while True:
                await self.cluster_info()
                await asyncio.sleep(CLUSTER_EVERY_S)

    async def _drop_link(self) -> None:
        self._connected.clear()
        if self._pinger is not None:
            self._pinger.cancel()
        if self._cluster_task is not None:
            self._cluster_task.cancel()
        if self.link is not None:
            await self.link.close()
        if self._channel is not None:
            with contextlib.suppress(Exception):
                await self._channel.close()
        self.link = self._channel = None

    @property
    def connected(self) -> bool:
        """Whether the link to the agent is up now."""
        return self.link is not None and not self.link.closed.is_set()

    async def ensure_connected(self) -> None:
        """``start`` unless the link is up, for a caller that does not keep the host connected in the background
        (a command; the session service, long-lived): a link that dropped is let go first. Once a connect
        failed, the host is tried again at most every ``RETRY_CONNECT_S``, in the background, and its last
        error is raised at once meanwhile: a host that does not answer costs each later request nothing (not a
        connect timeout), and says why as before. A failure whose fix is a file of the user's (``fixed_by``:
        ``gputui trust`` writing known_hosts) is tried again by the first request after that file changed."""
        if self.connected:
            return
        failed = self._connect_failed
        if failed is not None and fix_files(failed[1]) != failed[2]:
            failed = None  # the user may have fixed it (gputui trust): this caller waits for the new try
        if self._connecting is None or self._connecting.done():
            if failed is not None and time.monotonic() - failed[0] < RETRY_CONNECT_S:
                raise failed[1].with_traceback(None)
            self._connecting = asyncio.ensure_future(self._connect_again())
            self._connecting.add_done_callback(lambda t: t.cancelled() or t.exception())  # said by its callers
        if failed is not None:
            raise failed[1].with_traceback(None)  # the new try goes on without this caller
        await asyncio.shield(self._connecting)

    async def _connect_again(self) -> None:
        try:
            await self._drop_link()
            await self.start()
        except Exception as exc:
            self._connect_failed = (time.monotonic(), exc, fix_files(exc))
            raise
        self._connect_failed = None

    async def start(self) -> None:
        """Connect once; raise HostError / HostUnavailable with a user-facing message on failure."""
        self._publish(state=M.CONNECTING)
        try:
            await self._connect()
        except (HostError, HostUnavailable) as exc:
            self._publish(state=M.ERROR, error=str(exc))
            raise

    def run_in_background(self) -> asyncio.Task[None]:
        """Keep the host connected until close(): reconnect with backoff after any drop."""
        if self._runner is None:
            self._runner = asyncio.create_task(self._run())
        return self._runner

    def reconnect_now(self) -> None:
        """Connect again at once where the host is down (e.g. its instance was just started): a reconnect
        waiting for its backoff goes now, and a host given up on (an error retrying would not fix) is tried
        again. A connected host is left alone."""
        if self._closing or self.link is not None:
            return
        if self._runner is not None and self._runner.done():
            self._runner = None
            self.run_in_background()
        else:
            self._wake.set()

    async def _pause(self, delay: float) -> bool:
        """The backoff's sleep, cut short by ``reconnect_now`` (also one asked while the last attempt ran):
        whether it was."""
        try:
            await asyncio.wait_for(self._wake.wait(), delay)
        except asyncio.TimeoutError:
            return False
        self._wake.clear()
        return True

    async def _until_changed(self, exc: HostError) -> None:
        """Until a file of ``exc.fixed_by`` changes (looked at every ``FIX_LOOK_S``), or ``reconnect_now``."""
        states = fix_files(exc)
        while not self._closing and fix_files(exc) == states and not await self._pause(FIX_LOOK_S):
            pass

    async def _run(self) -> None:
        backoff = Backoff()
        while not self._closing:
            if self.link is None:
                try:
                    self._publish(state=M.CONNECTING if backoff.attempt == 0 else M.RECONNECTING)
                    await self._connect()
                    backoff.reset()
                except HostError as exc:
                    self._publish(state=M.ERROR, error=str(exc), detail=None)
                    if not exc.fixed_by:
                        return  # auth / missing python: retrying would only hammer the host
                    await self._until_changed(exc)  # an unknown host key: until gputui trust (or another edit)
                    continue
                except Exception as exc:
                    if not isinstance(exc, RETRYABLE):  # a bug must not end reconnecting silently
                        log.exception("%s: unexpected error while connecting; retrying", self.name)
                    await self._drop_link()
                    delay = backoff.next_delay()
                    self._publish(
                        state=M.RECONNECTING,
                        error=str(exc),
                        detail=f"attempt {backoff.attempt}, next in {delay:.1f} s",
                    )
                    await self._pause(delay)
                    continue
            assert self.link is not None
            await self.link.closed.wait()
            if self._closing:
                return
            reason = self.link.close_reason
            await self._drop_link()
            delay = backoff.next_delay()
            self._publish(
                state=M.RECONNECTING, error=reason, detail=f"attempt {backoff.attempt}, next in {delay:.1f} s"
            )
            await self._pause(delay)

    async def wait_connected(self, timeout: float | None = None) -> None:
        await asyncio.wait_for(self._connected.wait(), timeout)

    async def close(self) -> None:
        self._closing = True
        if self._connecting is not None and not self._connecting.done():
            self._connecting.cancel()
            await asyncio.wait({self._connecting}, timeout=1.0)  # (its error, if any, is its callers')
        if self._runner is not None:
            while not self._runner.done():  # again if need be: on Python < 3.12 wait_for can lose a cancel
                self._runner.cancel()
                await asyncio.wait({self._runner}, timeout=1.0)
            with contextlib.suppress(asyncio.CancelledError):
                await self._runner
        if self.metrics_interval is not None and self.link is not None and not self.link.closed.is_set():
            with contextlib.suppress(LinkClosed, AgentError):  # a deliberate close: no lingering sampler
                await self.link.request(P.OP_SHUTDOWN, timeout=2.0)
        for follow in list(self._follows.values()):
            if follow.catchup is not None:
                follow.catchup.cancel()
        await self._drop_link()
        with contextlib.suppress(Exception):
            await self.transport.close()
        self._publish(state=M.CLOSED)

    # --- commands ---------------------------------------------------------------------------------------------
    async def _linked(self, timeout: float | None) -> Link:
        """The open link, waiting for the reconnect when the session is reconnecting (LinkClosed if it is not
        reconnecting, or not back within ``timeout``)."""
        while (link := self.link) is None or link.closed.is_set():
            if self._runner is None or self._runner.done():
                raise LinkClosed(self._snapshot.error or "not connected")
            if link is not None and self._connected.is_set():
                await asyncio.sleep(0.05)  # closed but not yet dropped: the runner drops it next
                continue
            try:
                await asyncio.wait_for(self._connected.wait(), timeout)
            except asyncio.TimeoutError:  # an OSError on Python >= 3.11, and without a message
                why = self._snapshot.error or "still connecting"
                raise LinkClosed(f"{self.name}: not connected within {timeout:g} s ({why})") from None
        return link

    async def request(self, op: str, timeout: float | None = 30.0, **args: Any) -> Any:
        """Send one request, waiting for a connection first when the session is reconnecting."""
        if self.link is None or self.link.closed.is_set():
            if self._runner is None:
                raise LinkClosed(self._snapshot.error or "not connected")
            try:
                await self.wait_connected(timeout)
            except asyncio.TimeoutError:  # an OSError on Python >= 3.11, and without a message
                why = self._snapshot.error or "still connecting"
                raise LinkClosed(f"{self.name}: not connected within {timeout:g} s ({why})") from None
        assert self.link is not None
        return await self.link.request(op, timeout=timeout, **args)

    async def start_job(
        self,
        argv: list[str],
        *,
        name: str | None = None,
        cwd: str | None = None,
        env: dict[str, str] | None = None,
        gpus: str | None = None,
        price_per_hour: float | None = None,
        code: dict[str, Any] | None = None,
        queue: P.QueueRequest | None = None,
        artifacts: tuple[str, ...] = (),
        slurm: dict[str, Any] | None = None,
        restart: dict[str, Any] | None = None,
        secrets: dict[str, str] | None = None,
        container: P.ContainerRequest | None = None,
        group: P.GroupRequest | None = None,
    ) -> M.Job:
        """Start a job now, or with ``queue`` put it in the host's queue (it starts when its GPUs are free).
        ``secrets``: variables the host keeps out of the job's record (remote_agent/jobs/secrets.py);
        ``container``: run it in a container image (remote_agent/jobs/image.py); ``group``: one part of a job over
        several hosts (remote_agent/jobs/group.py)."""
        args: dict[str, Any] = {"argv": argv, "name": name, "cwd": cwd, "env": env or {}, "gpus": gpus,
                                "price_per_hour": price_per_hour}
        if code:
            args["code"] = code
        if queue is not None:
            args["queue"] = queue
        if artifacts:
            args["artifacts"] = list(artifacts)
        if slurm is not None:
            args["slurm"] = slurm  # submit with sbatch on a Slurm login node
        if restart is not None:
            args["restart"] = restart  # restart policy (remote_agent/jobs/restart.py)
        if secrets:
            args["secrets"] = secrets
        if container is not None:
            args["container"] = container
        if group is not None:
            args["group"] = group
        data = await self.request(P.OP_JOBS_START, **args)
        self._set_job(data)
        self._publish()
        return self._jobs[str(data["id"])]

    async def group_check(self, **args: Any) -> P.GroupCheckResult:
        """Whether this host's part of a job over several hosts can run (remote_agent/jobs/group.py)."""
        result: P.GroupCheckResult = await self.request(P.OP_JOBS_GROUP_CHECK, **args)
        return result

    async def cluster_info(self) -> P.ClusterInfo:
        """A Slurm login node's partitions and nodes (one sinfo on the host), kept in the snapshot."""
        info: P.ClusterInfo = await self.request(P.OP_SLURM_INFO, timeout=60)
        self._publish(cluster=info)
        return info

    async def list_jobs(self) -> list[M.Job]:
        await self._fetch_jobs(self.request)
        self._publish()
        return list(self._snapshot.jobs)

    async def get_job(self, job: str) -> M.Job:
        """One job as the host has it now (an AgentError ``not_found`` when it has no such job)."""
        data = await self.request(P.OP_JOBS_GET, job=job)
        self._set_job(data)
        return self._jobs[str(data["id"])]

    async def kill_job(self, job: str, grace_s: float = 10.0, queued_only: bool = False) -> M.Job:
        """Kill a job (a queued one leaves the queue); ``queued_only``: only take it out of the queue, an
        AgentError when it started (or ended) meanwhile."""
        extra = {"queued_only": True} if queued_only else {}
        data = await self.request(P.OP_JOBS_KILL, timeout=3 * grace_s + 30, job=job, grace_s=grace_s, **extra)
        self._set_job(data)
        self._publish()
        return self._jobs[str(data["id"])]

    async def job_series(self, job: str, max_reads: int = 32) -> JobSeries:
        """The job's metric series as the host keeps them beside its log; the host reads a bounded stretch
        of a long log per request, so this asks again (``max_reads`` times at most) until it has read it all."""
        res: Any = None
        for _ in range(max(1, max_reads)):
            res = await self.request(P.OP_LOGS_SERIES, job=job)
            if not isinstance(res, dict) or not isinstance(res.get("offset"), int) or res.get("done") is True:
                break
            if not isinstance(res.get("size"), int) or res["offset"] >= res["size"]:
                break
        from gputui.core.session.series import (
            JobSeries,  # here: it loads the log parser's metric names, which status needs not
        )

        return JobSeries.from_wire(self.name, job, res)

    async def list_queue(self) -> P.QueueListResult:
        """The host's queued jobs in order, each with its position and what it waits for."""
        result: P.QueueListResult = await self.request(P.OP_QUEUE_LIST)
        return result

    async def move_queued(self, job: str, to: int) -> P.QueueListResult:
        """Put a queued job at position ``to`` (1 = next); the queue after the move."""
        result: P.QueueListResult = await self.request(P.OP_QUEUE_MOVE, job=job, to=to)
        return result

    async def sample(self) -> M.MetricsSample:
        sample = self._add_sample(await self.request(P.OP_METRICS_SAMPLE, **self.sample_args))
        self._publish()
        return sample

    async def read_log(
        self, job: str, offset: int = 0, tail_lines: int | None = None
    ) -> tuple[int, bytes, int]:
        """(offset, data, size) of at most one chunk; ``tail_lines`` starts at the last N lines."""
        res = await self.request(P.OP_LOGS_READ, job=job, offset=offset, tail_lines=tail_lines)
        return int(res["offset"]), P.unb64(res["b64"]), int(res["size"])

    async def copy_log(
        self, job: str, offset: int, on_data: Callable[[bytes], None], pace: Callable[[], Awaitable[None]] | None = None
    ) -> int:
        """Every byte of the job's log from ``offset`` to its end, handed to ``on_data`` in order; returns the
        offset reached. Each read also says the log's size: far from the end the rest comes as a raw stream
        (as a follow's catch-up does), so a short log costs one request and a long one no extra round trip.
        ``pace`` is awaited after each chunk: nothing more is read from the host until it returns."""
        copy = LogFollow(job, offset, on_data, lambda _msg: None, lambda _info: None, pace=pace)
        streams = type(self.transport).open_agent_stream is not Transport.open_agent_stream
        while True:
            res = await self.request(P.OP_LOGS_READ, job=job, offset=copy.cursor)
            data, size, path = P.unb64(res["b64"]), int(res["size"]), res.get("path")
            if data:
                copy.cursor += len(data)
                on_data(data)
                if pace is not None:
                    await pace()
            far = path and size - copy.cursor >= CATCHUP_MIN_BYTES and copy.stream_failures < CATCHUP_TRIES
            if streams and far:
                await self._catch_up(copy, str(path), size)
            elif not data or copy.cursor >= size:
                return copy.cursor

    async def log_times(self, job: str, start: int, end: int) -> list[tuple[int, float]]:
        """When the job's log bytes ``start..end`` were written: (offset, unix time) pairs, oldest first."""
        res = await self.request(P.OP_LOGS_TIMES, job=job, start=start, end=end)
        return [(int(o), float(t)) for o, t in res.get("times") or ()]

    async def log_tails(self, jobs: Sequence[str], max_bytes: int) -> AsyncIterator[dict[str, LogTail]]:
        """The last ``max_bytes`` of each job's log and when they were written, by job id, a page at a time:
        one ``logs.tails`` request per page (the agent bounds each reply), not one per job. The next page is
        asked for while the caller works on this one (two requests in flight at most)."""
        per_page = max(1, min(P.TAILS_JOBS, P.TAILS_PAGE_BYTES // max(1, max_bytes)))
        rest = list(jobs)
        asked: list[str] = []
        pending: asyncio.Future[Any] | None = None

        def ask() -> asyncio.Future[Any] | None:
            nonlocal asked, rest
            asked, rest = asked + rest[: per_page - len(asked)], rest[per_page - len(asked) :]
            if not asked:
                return None
            return asyncio.ensure_future(self.request(P.OP_LOGS_TAILS, jobs=asked, max_bytes=max_bytes))

        try:
            pending = ask()
            while pending is not None:
                got = (await pending).get("tails") or []
                if not got:
                    raise AgentError("bad_reply", "logs.tails answered no job")
                asked = asked[len(got) :]  # what the reply did not reach goes first in the next request
                pending = ask()
                yield dict(_log_tail(tail) for tail in got)
        finally:
            if pending is not None:
                pending.cancel()

    async def follow_log(
        self,
        job: str,
        offset: int,
        on_data: Callable[[bytes], None],
        on_end: Callable[[dict[str, Any]], None],
        on_gap: Callable[[str], None] = lambda _msg: None,
        pace: Callable[[], Awaitable[None]] | None = None,
    ) -> LogFollow:
        """Stream the job's log from ``offset``; resumes from the cursor after every reconnect.

        Far behind the log's end, the bytes come first as a raw stream on a channel of their own (see
        ``_catch_up``, which awaits ``pace`` after each chunk), then the agent follows the log from there on
        its channel.
        """
        if job in self._follows:
            await self.unfollow_log(job)
        follow = LogFollow(job, offset, on_data, on_gap, on_end, pace=pace)
        self._follows[job] = follow
        try:
            await self._start_follow(await self._linked(30.0), follow)
        except LinkClosed:
            if self._runner is None:
                self._follows.pop(job, None)
                raise
            # the link dropped under the request: the reconnect resumes every follow from its cursor
        except BaseException:
            self._follows.pop(job, None)
            raise
        return follow

    async def _start_follow(self, link: Link, follow: LogFollow) -> None:
        """Have the agent follow the log from the cursor, or start a raw catch-up when far behind."""
        if follow.catchup is not None or follow.starting:
            return
        follow.starting = True
        try:
            target = await self._far_behind(link, follow)
            if target is None:
                await link.request(P.OP_LOGS_FOLLOW, job=follow.job, offset=follow.cursor)
            elif self._follows.get(follow.job) is follow:
                follow.catchup = asyncio.create_task(self._catch_up_then_follow(follow, *target))
        finally:
            follow.starting = False

    async def _far_behind(self, link: Link, follow: LogFollow) -> tuple[str, int] | None:
        """(path on the host, size) of the log when it reaches CATCHUP_MIN_BYTES past the cursor and a raw
        stream may fetch them; None to follow on the agent channel (which also reports an unreadable log)."""
        if follow.stream_failures >= CATCHUP_TRIES or type(self.transport).open_agent_stream is (
            Transport.open_agent_stream
        ):
            return None
        try:
            res = await link.request(P.OP_LOGS_READ, job=follow.job, offset=follow.cursor, max_bytes=0)
        except AgentError:
            return None
        size, path = int(res["size"]), res.get("path")
        return (str(path), size) if path and size - follow.cursor >= CATCHUP_MIN_BYTES else None

    async def _catch_up_then_follow(self, follow: LogFollow, path: str, size: int) -> None:
        try:
            await self._catch_up(follow, path, size)
        finally:
            follow.catchup = None
        if self._follows.get(follow.job) is not follow:
            return
        with contextlib.suppress(LinkClosed, AgentError):  # the reconnect resumes it (it has no catch-up now)
            await self._start_follow(await self._linked(None), follow)

    async def open_stream(self, args: list[str]) -> AgentChannel:
        """A raw stream channel of this agent build (``cat``, ``receive``) on the host's connection; the bytes
        it brings keep the agent channel from being judged silent (see ``_ping_loop``)."""
        channel = await self.transport.open_agent_stream(args)
        channel.reader = _HeardReader(channel.reader, self._heard)
        return channel

    def _heard(self) -> None:
        self._stream_rx = asyncio.get_running_loop().time()

    async def _catch_up(self, follow: LogFollow, path: str, size: int) -> None:
        """The log's bytes from the cursor up to ``size`` as the agent's ``cat`` writes them on a channel of
        its own: no JSON, no base64. The cursor counts every byte received, so a cut stream loses nothing:
        the next start goes on from there (a stream again while still far behind)."""
        start = follow.cursor
        try:
            channel = await self.open_stream(["cat", path, str(start), str(size - start)])
            try:
                while follow.cursor < size and (data := await channel.reader.read(CATCHUP_READ)):
                    data = data[: size - follow.cursor]
                    follow.cursor += len(data)
                    follow.on_data(data)
                    if follow.pace is not None:
                        await follow.pace()
            finally:
                await channel.close()
        except Exception as exc:  # link lost (OSError, asyncssh errors), no channel: the follow goes on
            log.info(
                "%s: log catch-up of job %s stopped at %d: %s", self.name, follow.job, follow.cursor, exc
            )
        follow.stream_failures = 0 if follow.cursor > start else follow.stream_failures + 1

    async def exec(self, argv: list[str], timeout_s: float) -> dict[str, Any]:
        """Run ``argv`` on the host (no shell), killed after ``timeout_s``: ``exit_code``, ``stdout``, ``stderr``."""
        result: dict[str, Any] = await self.request(
            P.OP_EXEC, timeout=timeout_s + 10, argv=argv, timeout_s=timeout_s
        )
        return result

    async def doctor(self, timeout_s: float, python: str | None = None) -> dict[str, Any]:
        """The host's readiness checks; the torch probe may take ``timeout_s``, the reply a bit more."""
        args: dict[str, Any] = {"timeout_s": timeout_s}
        if python:
            args["python"] = python
        result: dict[str, Any] = await self.request(P.OP_DOCTOR, timeout=timeout_s + 30.0, **args)
        return result or {}

    async def configure_autostop(self, config: dict[str, Any]) -> P.WatchdogConfigureResult:
        """Give the host's watchdog its rules (see gputui.core.money.autostop)."""
        result: P.WatchdogConfigureResult = await self.request(P.OP_WATCHDOG_CONFIGURE, config=config)
        return result

    async def release_check(self, **args: Any) -> P.ReleaseCheckResult:
        """The host proves, without side effects, that its release would work (gputui.core.money.release)."""
        result: P.ReleaseCheckResult = await self.request(P.OP_RELEASE_CHECK, timeout=40.0, **args)
        return result

    async def release_instance(self, **args: Any) -> P.ReleaseInstanceResult:
        """The host's instance as its provider says now (``release.instance``: price, state, spot)."""
        result: P.ReleaseInstanceResult = await self.request(P.OP_RELEASE_INSTANCE, timeout=60.0, **args)
        return result

    async def release_provider(self, timeout_s: float, **args: Any) -> P.ReleaseProviderResult:
        """The host releases itself through its provider's API and confirms it (gputui.core.money.release)."""
        result: P.ReleaseProviderResult = await self.request(
            P.OP_RELEASE_PROVIDER, timeout=timeout_s + 90.0, release_timeout=timeout_s, **args
        )
        return result

    async def notify_test(self, settings: dict[str, Any]) -> P.NotifyTestResult:
        """The host sends a test notification now with these ``[notify]`` settings (gputui.core.money.autostop)."""
        result: P.NotifyTestResult = await self.request(P.OP_NOTIFY_TEST, timeout=60.0, notify=settings)
        return result

    async def snooze_autostop(self, minutes: float) -> None:
        await self.request(P.OP_WATCHDOG_SNOOZE, minutes=minutes)

    async def cancel_autostop(self) -> None:
        await self.request(P.OP_WATCHDOG_CANCEL)

    def log_cursor(self, job: str) -> int | None:
        """The log offset the follow of ``job`` has reached: in its ``on_data``, the end of the chunk handed; in
        its ``on_gap``, where it goes on (0 after a reset). None where no follow of it runs."""
        follow = self._follows.get(job)
        return follow.cursor if follow is not None else None

    async def unfollow_log(self, job: str) -> None:
        follow = self._follows.pop(job, None)
        if follow is not None and follow.catchup is not None:
            follow.catchup.cancel()
        if follow is not None and self.link is not None:
            with contextlib.suppress(LinkClosed, AgentError):
                await self.link.request(P.OP_LOGS_UNFOLLOW, job=job)
