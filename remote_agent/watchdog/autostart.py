"""``resume_on_boot``: an ``@reboot`` line in the user's crontab that brings the agent's work back after a reboot
with no client connected (jobs lost in the reboot resumed, the queue run, the idle autostop armed again).

Only with the host setting on (the client sends it at every connect); with it off, the line is taken out again.
The line is tagged with the state dir it serves, so each gputui state dir has at most one and the user's own
lines are kept byte for byte. What runs at boot is ``boot``: it re-arms the idle rule for the new boot (a
deadline is not carried over a reboot: it may be long past) and starts the watchdog where there is work.
Stdlib only, Python >= 3.8.
"""

import os
import shlex
import shutil
import subprocess
import tempfile
import time
from typing import Any, Dict, List, Optional, Tuple

from ..fsutil import read_json, write_json

TAG = "# gputui resume_on_boot: "
COMMAND_TIMEOUT_S = 10.0
MAX_CRONTAB = 1024 * 1024  # bytes of a crontab read (a bigger one is left alone)


def tagged(state_dir: str) -> str:
    """The end of this state dir's line: the tag, with each ``%`` written ``\\%`` (a bare ``%`` ends cron's
    command there; ``%`` to ``\\%`` is one-to-one, so the tag still names one state dir)."""
    return TAG + state_dir.replace("%", "\\%")


def entry(launcher: List[str], state_dir: str) -> str:
    """The crontab line for ``state_dir``. Cron hands the command to /bin/sh after turning each ``%`` into a line
    break unless a backslash comes before it (the backslash is then dropped; every other backslash is kept):
    each ``%`` of the quoted command is written ``''\\%``, so no backslash of a path ever stands before one, and
    the shell reads the empty ``''`` as nothing."""
    command = " ".join(shlex.quote(word) for word in launcher + ["boot", state_dir]).replace("%", "''\\%")
    return "@reboot %s >/dev/null 2>&1 %s" % (command, tagged(state_dir))


def _crontab(
    args: List[str], data: Optional[bytes] = None, env: Optional[Dict[str, str]] = None
) -> "subprocess.CompletedProcess[bytes]":
    return subprocess.run(
        ["crontab"] + args, input=data, capture_output=True, timeout=COMMAND_TIMEOUT_S, env=env,
        stdin=None if data is not None else subprocess.DEVNULL,
    )


def _said(res: "subprocess.CompletedProcess[bytes]") -> str:
    return res.stderr.decode("utf-8", "replace").strip()[:200]


def read_crontab() -> Tuple[Optional[bytes], str]:
    """The user's crontab, byte for byte (b"" when there is none), or (None, why not).

    Debian's ``crontab -l`` shows a carriage return as the two characters ``\\r``, so a listing holding ``\\r``
    may not be the real bytes: those come from ``crontab -e`` with an "editor" that copies the file it is handed
    and changes nothing. The copy is taken only when it lists as the listing does."""
    listed = _crontab(["-l"])
    if listed.returncode != 0:
        if b"no crontab" in listed.stderr.lower():
            return b"", ""
        return None, "crontab -l failed: %s" % _said(listed)
    if len(listed.stdout) > MAX_CRONTAB:
        return None, "the crontab is over 1 MiB: left as it is"
    if b"\\r" not in listed.stdout:
        return listed.stdout, ""
    with tempfile.TemporaryDirectory(prefix="gputui-crontab-") as tmp:
        copy = os.path.join(tmp, "copy")
        editor = "cat > %s <" % shlex.quote(copy)  # run as ``sh -c "$EDITOR FILE"``
        env = dict(os.environ, EDITOR=editor, VISUAL=editor)
        _crontab(["-e"], env=env)
        try:
            with open(copy, "rb") as f:
                real = f.read(MAX_CRONTAB + 1)
        except OSError:
            real = None
    if real is None or real.replace(b"\r", b"\\r") != listed.stdout:
        return None, ("crontab -l shows \\r, which may stand for a carriage return, and crontab -e gave no copy "
                      "that matches: the crontab is left as it is")
    return real, ""


def sync(want: bool, state_dir: str, launcher: List[str]) -> Dict[str, Any]:
    """Make the user's crontab hold this state dir's line exactly when ``want``: ``{"ok", "changed", "detail"}``.
    Our line is found by its tag, so it is taken out even when nothing of ours remembers adding it. The rest of
    the crontab is kept byte for byte: it is split on ``\\n`` only (never on the other line ends Python knows).
    Never raises; a host without ``crontab`` (most containers) is ``ok: False`` saying so when the line is
    wanted, and nothing to do when it is not."""
    if want and any(ch in word for word in launcher + [state_dir] for ch in "\n\r\0"):
        return {"ok": False, "changed": False, "detail": "the state dir or the agent's path holds a line break: "
                "no crontab line is made for it"}  # (a line break would end the line and start another)
    if shutil.which("crontab") is None:
        return {"ok": not want, "changed": False,
                "detail": "no crontab on this host: resume_on_boot needs cron" if want else ""}
    try:
        data, why = read_crontab()
        if data is None:
            return {"ok": False, "changed": False, "detail": why}
        mine, line = os.fsencode(tagged(state_dir)), os.fsencode(entry(launcher, state_dir))
        lines = data.split(b"\n")
        ours = [each for each in lines if each.endswith(mine)]
        if ours == ([line] if want else []):
            return {"ok": True, "changed": False, "detail": "in the crontab" if want else ""}
        kept = b"\n".join(each for each in lines if not each.endswith(mine))
        if want:
            kept += (b"\n" if kept and not kept.endswith(b"\n") else b"") + line + b"\n"
        done = _crontab(["-"], kept) if kept else _crontab(["-r"])
        if done.returncode != 0:
            return {"ok": False, "changed": False, "detail": "crontab failed: %s" % _said(done)}
        return {"ok": True, "changed": True, "detail": "added to the crontab" if want else "taken out of the crontab"}
    except (OSError, subprocess.SubprocessError) as exc:
        return {"ok": False, "changed": False, "detail": "crontab failed: %s" % exc}


def rearm(state_dir: str, config_name: str, boot_id: str, now: Optional[float] = None) -> bool:
    """The watchdog config of an earlier boot, taken into this one where it asked for ``resume_on_boot``: the
    idle rule counts from now, a deadline is dropped. True when it was re-armed."""
    path = os.path.join(state_dir, config_name)
    config = read_json(path)
    if not isinstance(config, dict) or not config.get("resume_on_boot") or config.get("boot_id") == boot_id:
        return False
    for key in ("snoozed_until", "cancelled", "release_at"):
        config.pop(key, None)
    config.update(boot_id=boot_id, armed_at=time.time() if now is None else now)
    write_json(path, config)
    return True


def boot(state_dir: str, launcher: List[str]) -> int:
    """What the ``@reboot`` line runs: re-arm the idle rule for this boot and start the watchdog, which resumes
    the jobs the reboot lost (their restart policies), runs the queue and keeps the autostop. 0, or 1 when the
    state dir is gone or not ours (the line is then left for the next connect to take out)."""
    from ..host.boot import boot_id
    from . import daemon

    if not os.path.isdir(state_dir) or os.stat(state_dir).st_uid != os.getuid():
        return 1
    now_boot = boot_id()
    if now_boot and rearm(state_dir, daemon.CONFIG, now_boot):
        daemon.log_line(state_dir, "resume_on_boot: armed again for this boot (the idle rule; no deadline)")
    daemon.ensure_running(state_dir, launcher)
    return 0
