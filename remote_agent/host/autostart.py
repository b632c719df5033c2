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
import time
from typing import Any, Dict, List, Optional

from ..fsutil import read_json, write_json

TAG = "# gputui resume_on_boot: "
COMMAND_TIMEOUT_S = 10.0
MAX_CRONTAB = 1024 * 1024  # bytes of a crontab read (a bigger one is left alone)


def entry(launcher: List[str], state_dir: str) -> str:
    """The crontab line for ``state_dir`` (cron hands the command to /bin/sh; ``%`` is special to cron)."""
    command = " ".join(shlex.quote(word) for word in launcher + ["boot", state_dir]).replace("%", "\\%")
    return "@reboot %s >/dev/null 2>&1 %s%s" % (command, TAG, state_dir)


def _crontab(args: List[str], text: Optional[str] = None) -> "subprocess.CompletedProcess[str]":
    return subprocess.run(
        ["crontab"] + args, input=text, capture_output=True, text=True, timeout=COMMAND_TIMEOUT_S,
        stdin=None if text is not None else subprocess.DEVNULL,
    )  # fmt: skip


def sync(want: bool, state_dir: str, launcher: List[str]) -> Dict[str, Any]:
    """Make the user's crontab hold this state dir's line exactly when ``want``: ``{"ok", "changed", "detail"}``.
    Never raises; a host without ``crontab`` (most containers) is ``ok: False`` saying so when the line is
    wanted, and nothing to do when it is not."""
    if want and any(ch in word for word in launcher + [state_dir] for ch in "\n\r\0"):
        return {"ok": False, "changed": False, "detail": "the state dir or the agent's path holds a line break: "
                "no crontab line is made for it"}  # (a line break would end the line and start another)
    if shutil.which("crontab") is None:
        return {"ok": not want, "changed": False,
                "detail": "no crontab on this host: resume_on_boot needs cron" if want else ""}  # fmt: skip
    try:
        listed = _crontab(["-l"])
        if listed.returncode != 0 and "no crontab" not in listed.stderr.lower():
            return {"ok": False, "changed": False, "detail": "crontab -l failed: %s" % listed.stderr.strip()[:200]}
        text = listed.stdout if listed.returncode == 0 else ""
        if len(text.encode("utf-8", "replace")) > MAX_CRONTAB:
            return {"ok": False, "changed": False, "detail": "the crontab is over 1 MiB: left as it is"}
        mine = TAG + state_dir
        kept = [line for line in text.splitlines() if not line.endswith(mine)]
        lines = kept + ([entry(launcher, state_dir)] if want else [])
        if lines == text.splitlines():
            return {"ok": True, "changed": False, "detail": "in the crontab" if want else ""}
        if not want and not kept:
            done = _crontab(["-r"])
        else:
            done = _crontab(["-"], "".join(line + "\n" for line in lines))
        if done.returncode != 0:
            return {"ok": False, "changed": False, "detail": "crontab failed: %s" % done.stderr.strip()[:200]}
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
    from ..watchdog import daemon as W
    from .boot import boot_id

    if not os.path.isdir(state_dir) or os.stat(state_dir).st_uid != os.getuid():
        return 1
    now_boot = boot_id()
    if now_boot and rearm(state_dir, W.CONFIG, now_boot):
        W.log_line(state_dir, "resume_on_boot: armed again for this boot (the idle rule; no deadline)")
    W.ensure_running(state_dir, launcher)
    return 0
