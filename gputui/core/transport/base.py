"""Transports open the agent's channel on a host; the local one runs the agent as a subprocess."""

from __future__ import annotations

import asyncio
import collections
import contextlib
import subprocess
import sys
from abc import ABC, abstractmethod
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gputui.core.deploy import agentproc
from gputui.core.errors import ExitStatus, GputuiError, Unreachable
from gputui.core.transport.link import ByteReader, ByteWriter
from remote_agent.protocol import MAX_FRAME_BYTES


class HostUnavailable(Unreachable, ConnectionError):
    """The host cannot be reached right now; trying again later may work (refused, timeout, link loss)."""


class HostError(GputuiError, RuntimeError):
    """A failure that retrying will not fix (auth, unknown host key, missing python3): the user must act.
    ``fixed_by``: the user's files whose change may be that act (the known_hosts files ``gputui trust`` writes)."""

    def __init__(self, message: str, kind: str = "error", fixed_by: tuple[str, ...] = ()) -> None:
        super().__init__(message)
        self.kind = kind  # e.g. "auth", "host_key", "missing_python", "config", "disk_full"
        self.fixed_by = fixed_by

    @property
    def status(self) -> ExitStatus:  # type: ignore[override]
        """4 (the host refused us); a config problem is a usage error, a full disk a failure (free space)."""
        return {"config": ExitStatus.USAGE, "disk_full": ExitStatus.FAILED}.get(self.kind, ExitStatus.REFUSED)


#: Each file's (inode, modification time, size) at one moment, None where there is none.
FileStates = tuple[tuple[int, int, int] | None, ...]


def fix_files(exc: BaseException) -> FileStates:
    """The state now of the files whose change may fix ``exc`` (a HostError's ``fixed_by``; none for others):
    compared with an earlier state, whether the user may have acted since."""
    states: list[tuple[int, int, int] | None] = []
    for path in exc.fixed_by if isinstance(exc, HostError) else ():
        try:
            st = Path(path).expanduser().stat()
        except OSError:
            states.append(None)
        else:
            states.append((st.st_ino, st.st_mtime_ns, st.st_size))
    return tuple(states)


@dataclass
class AgentChannel:
    """The agent's stdin/stdout as byte streams, and how to close them."""

    reader: ByteReader
    writer: ByteWriter
    close: Callable[[], Awaitable[None]]
    stderr: collections.deque[str] = field(default_factory=lambda: collections.deque(maxlen=20))
    _stderr_task: asyncio.Task[None] | None = field(default=None, repr=False)

    def stderr_text(self) -> str:
        return "\n".join(self.stderr).strip()

    def collect_stderr(self, stream: ByteReader) -> None:
        """Keep the last lines the agent writes to stderr, for error messages."""
        self._stderr_task = asyncio.create_task(self._collect(stream))

    async def _collect(self, stream: ByteReader) -> None:
        with contextlib.suppress(Exception):
            while line := await stream.readline():
                text = line.decode("utf-8", "replace") if isinstance(line, bytes) else line
                self.stderr.append(text.rstrip())


class Transport(ABC):
    """Opens agent channels to one host."""

    #: argv prefix that runs a command on the host with a terminal (for tmux attach), e.g. ["ssh", "-t", host]
    @abstractmethod
    def terminal_prefix(self) -> list[str]: ...

    @abstractmethod
    async def open_agent(self) -> AgentChannel: ...

    async def open_agent_stream(self, args: list[str]) -> AgentChannel:
        """Run this agent build with ``args`` beside the agent channel: a raw byte stream (``cat``, pull)."""
        raise NotImplementedError

    async def close(self) -> None:  # noqa: B027 - optional hook, not abstract
        """Release whatever the transport holds (SSH connection); the local one holds nothing."""


class LocalTransport(Transport):
    """The zero-config default: the agent runs as a child process on this machine."""

    def __init__(
        self,
        state_dir: str,
        cache_dir: Path,
        python: str | None = None,
        idle_timeout: float = 30.0,
        nvidia_smi: str = "nvidia-smi",
    ) -> None:
        self.state_dir, self.cache_dir = state_dir, cache_dir
        self.python = python or sys.executable
        self.idle_timeout, self.nvidia_smi = idle_timeout, nvidia_smi

    def terminal_prefix(self) -> list[str]:
        return []

    async def open_agent(self) -> AgentChannel:
        argv = agentproc.serve_argv(
            self.python, self.cache_dir, self.state_dir, self.idle_timeout, self.nvidia_smi
        )
        early = agentproc.take(argv)  # started while the CLI imported (agentproc.start_early)
        if early is not None:
            return await _adopt(early)
        return await self._spawn(argv, _stop_process, limit=2 * MAX_FRAME_BYTES)

    async def open_agent_stream(self, args: list[str]) -> AgentChannel:
        return await self._spawn(agentproc.build_argv(self.python, self.cache_dir) + args, _end_process)

    async def _spawn(
        self, argv: list[str], stop: Callable[[asyncio.subprocess.Process], Awaitable[None]], **kw: Any
    ) -> AgentChannel:
        """The local agent build run as ``argv`` on pipes; ``stop(proc)`` ends it when the channel closes."""
        try:
            proc = await asyncio.create_subprocess_exec(
                *argv, stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE,
                start_new_session=True,  # Ctrl-C in the client's terminal is the client's, not the agent's
                umask=0o077, env=agentproc.private_env(), **kw,
            )
        except OSError as exc:
            raise HostError(
                f"cannot start the local agent with {self.python}: {exc}", "missing_python"
            ) from exc
        assert proc.stdin and proc.stdout and proc.stderr
        channel = AgentChannel(proc.stdout, proc.stdin, lambda: stop(proc))
        channel.collect_stderr(proc.stderr)
        return channel


async def _adopt(proc: subprocess.Popen[bytes]) -> AgentChannel:
    """An agent started early (``subprocess.Popen``) as an AgentChannel on this event loop."""
    assert proc.stdin and proc.stdout and proc.stderr
    loop = asyncio.get_running_loop()
    out, err = asyncio.StreamReader(limit=2 * MAX_FRAME_BYTES), asyncio.StreamReader()
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(out), proc.stdout)
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(err), proc.stderr)
    transport, protocol = await loop.connect_write_pipe(asyncio.streams.FlowControlMixin, proc.stdin)
    writer = asyncio.StreamWriter(transport, protocol, None, loop)

    async def stop() -> None:  # as _stop_process: EOF on stdin, killed if it lingers
        writer.close()
        try:
            await asyncio.wait_for(loop.run_in_executor(None, proc.wait), 5)
        except asyncio.TimeoutError:
            with contextlib.suppress(ProcessLookupError):
                proc.kill()
            await loop.run_in_executor(None, proc.wait)

    channel = AgentChannel(out, writer, stop)
    channel.collect_stderr(err)
    return channel


async def _end_process(proc: asyncio.subprocess.Process) -> None:
    """A stream's process: done, or not wanted any more (killed). What it sent that nobody read is drained
    first (at most a pipe's buffer, once it is gone): ``wait()`` also waits for its output's end, which a pipe
    paused with a full buffer never reaches (a pull cut short by a full local disk hung there)."""
    if proc.returncode is None:
        with contextlib.suppress(ProcessLookupError):
            proc.kill()
    if proc.stdout is not None:
        with contextlib.suppress(Exception):
            while await proc.stdout.read(1024 * 1024):
                pass
    await proc.wait()


async def _stop_process(proc: asyncio.subprocess.Process) -> None:
    """Close the agent's stdin (it exits on EOF); kill it if it does not go within a few seconds."""
    if proc.stdin is not None:
        with contextlib.suppress(Exception):
            proc.stdin.close()
    try:
        await asyncio.wait_for(proc.wait(), 5)
    except asyncio.TimeoutError:
        with contextlib.suppress(ProcessLookupError):
            proc.kill()
        await proc.wait()
