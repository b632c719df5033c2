"""Files and ports: ``sync``, ``pull``, ``forward`` — each command's parser beside its handler."""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
from typing import Any

from ..core import safetext
from ..core.config import file as cfg
from ..core.errors import ExitStatus, Unreachable
from ..core.session.host import HostSession
from .common import CliError, bounded, progress_printer, with_session


async def cmd_pull(args: argparse.Namespace) -> int:
    """Copy files from a host here: resumable, verified by sha256, never over a newer local file."""
    from ..core.files.pull import PullError, pull
    from ..core.files.wire import WireError

    specs, dest = args.paths, None
    if len(specs) > 1:
        specs, dest = specs[:-1], specs[-1]

    async def body(s: HostSession) -> int:
        try:
            with progress_printer() as show:
                outcomes = await pull(s, specs, dest, force=args.force, on_progress=show)
        except Unreachable:
            raise
        except (PullError, WireError, OSError) as exc:  # e.g. no room or no permission here, a host's bad answer
            raise CliError(f"pull: {safetext.clean(exc)}") from None
        status = ExitStatus.OK
        for o in outcomes:  # a host's file name is data: one line each, control characters escaped
            if o.status == "newer here":
                print(f"gputui: skipped {safetext.clean(o.target)}: the local file is newer (--force overwrites it)",
                      file=sys.stderr)
                status = ExitStatus.FAILED
            else:
                print(f"{o.status}: {safetext.clean(o.target)} ({o.size:,} bytes)")
        return status

    return await with_session(args, args.host, body)


async def sync_tree(s: HostSession, src: str, target: str | None, delete: bool, local: Any = None) -> Any:
    """Sync ``src`` to the host, reporting notes and a summary on stderr; the SyncResult. ``local``: the
    ``start_local`` of ``src`` begun before the connect."""
    from ..core.files.pull import PullError
    from ..core.files.sync import SyncError, sync
    from ..core.files.wire import WireError

    try:
        with progress_printer() as show:
            res = await sync(s, src, target, delete=delete, on_progress=show, local=local)
    except Unreachable:
        raise
    except (SyncError, PullError, WireError, OSError) as exc:  # e.g. a local file unreadable, a host's bad answer
        raise CliError(f"sync: {safetext.clean(exc)}") from None
    for note in res.notes:
        print(f"gputui: {safetext.clean(note)}", file=sys.stderr)
    print(f"gputui: synced {os.path.abspath(src)} to {s.name}:{safetext.clean(res.target)}: {res.sent} of {res.files} files sent "
          f"({res.bytes_sent:,} bytes), {res.deleted} deleted; tree {res.tree_sha256[:12]}", file=sys.stderr)
    return res


async def cmd_sync(args: argparse.Namespace) -> int:
    """Copy a local tree to a directory on the host: only changed files travel. The local tree is walked and
    hashed in a thread while the host connects."""
    from ..core.files.sync import start_local

    local = start_local(args.src)

    async def body(s: HostSession) -> int:
        res = await sync_tree(s, args.src, args.to, args.delete, local)
        print(res.target)
        return ExitStatus.FAILED if res.missing or any(n.startswith("not sent") for n in res.notes) else ExitStatus.OK

    try:
        return await with_session(args, args.host, body)
    finally:
        if not local.done():  # the connect failed: the walk's result is not wanted
            local.cancel()
        elif not local.cancelled():
            local.exception()  # retrieved: an error of the walk that the connect's error came before


async def cmd_forward(args: argparse.Namespace) -> int:
    """Reach a port on the host at 127.0.0.1 here until Ctrl-C; survives reconnects."""
    if cfg.load(args.config).host(args.host).transport == "local":
        print(f"{args.host} is this machine: open http://127.0.0.1:{args.remote_port}/ directly (no forward needed)")
        return ExitStatus.OK
    from ..core.files.forward import Forward

    async def body(s: HostSession) -> int:
        fwd = Forward(s, args.remote_port, args.local_port or 0,
                      lambda msg: print(f"gputui: {safetext.clean(msg)}", file=sys.stderr))
        url = await fwd.start()  # a ForwardError is a usage error (a busy port, a local host)
        print(f"{url} -> {args.host} port {args.remote_port} (Ctrl-C stops)", flush=True)
        try:
            await asyncio.Event().wait()
        finally:
            await fwd.close()
        return ExitStatus.OK

    return await with_session(args, args.host, body)


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    sy = sub.add_parser("sync", help="copy a local tree to the host: only changed files travel")
    sy.add_argument("host")
    sy.add_argument("src", nargs="?", default=".", help="local directory (default: here)")
    sy.add_argument("--to", metavar="DIR", help="directory on the host (default: ~/gputui-work/<name of SRC>)")
    sy.add_argument("--delete", action="store_true",
                    help="remove files an earlier sync put there that SRC no longer has")
    sy.set_defaults(func=cmd_sync)

    fw = sub.add_parser("forward", help="reach a port on the host at 127.0.0.1 here (TensorBoard, Jupyter)")
    fw.add_argument("host")
    fw.add_argument("remote_port", type=bounded(1, 65535, integer=True), metavar="REMOTE_PORT")
    fw.add_argument("local_port", type=bounded(0, 65535, integer=True), nargs="?", metavar="LOCAL_PORT",
                    help="port here (default: any free one)")
    fw.set_defaults(func=cmd_forward)

    pu = sub.add_parser("pull", help="copy files from a host here: resumable, sha256-checked")
    pu.add_argument("host")
    pu.add_argument("paths", nargs="+", metavar="[JOB:]PATH... [DEST]",
                    help="files, dirs or globs on the host (relative to job JOB's dir, else to ~), then DEST")
    pu.add_argument("--force", action="store_true", help="overwrite local files even when they are newer")
    pu.set_defaults(func=cmd_pull)
