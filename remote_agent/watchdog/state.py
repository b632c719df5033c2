"""The watchdog's files in the state dir (its settings, state, log, lock and owner record, the provider release
asked for and the last release check) and its log, shared by the loop (``daemon``), its rules (``rules``) and
the lock and takeover between builds (``takeover``)."""

import os
import time

from ..fsutil import open_regular

CONFIG, STATE, LOG, LOCK = "watchdog.json", "watchdog_state.json", "watchdog.log", "watchdog.lock"
#: Who holds the lock (``{"pid", "build", "revision"}``), and a newer build's request that it exit (``{"pid",
#: "build", "by"}``: the watchdog to exit, the build asking, the pid of the one waiting): see ``run``.
OWNER, STOP = "watchdog_owner.json", "watchdog.stop"
#: The provider release asked for (written before the call) and the last release check's verdict.
RELEASE_REQUEST, RELEASE_CHECK = "release_request.json", "release_check.json"
TAKEOVER = "watchdog.takeover.lock"  # held by the one new watchdog waiting to take over
#: Bumped when the watchdog's behaviour changes: a build never replaces a running watchdog of a higher one (an
#: older client connecting must not bring old release logic back).
REVISION = 3  # 3: releases through the provider, release_failed, the release check at arming
MAX_LOG_BYTES = 1024 * 1024
APPEND = os.O_WRONLY | os.O_APPEND | os.O_CREAT


def log_line(state_dir: str, message: str) -> None:
    """Append one stamped line to the watchdog log (past MAX_LOG_BYTES it becomes ``watchdog.log.1`` first,
    replacing the one before: the log never takes more than about twice that)."""
    stamp = time.strftime("%Y-%m-%d %H:%M:%S")
    path = os.path.join(state_dir, LOG)
    try:
        if os.lstat(path).st_size > MAX_LOG_BYTES:
            os.replace(path, path + ".1")
    except OSError:
        pass
    try:
        with os.fdopen(open_regular(path, APPEND), "a") as f:
            f.write("%s %s\n" % (stamp, message))
    except OSError:
        pass  # e.g. a planted symlink: never write outside the state dir
