"""Job secrets (``gputui run --secret NAME``): variables a job gets whose values never rest in a record.

A ``jobs.start`` request may carry ``secrets`` ({NAME: value}). The values go to ``secrets/values.json`` in the
job dir (dir 0700, file 0600), never to job.json or env.json: job.json lists the names only (``secrets``). The
runner puts them into the environment of each attempt, and they are deleted as soon as the job can no longer
start again:

- a tmux job without a restart policy: by its runner, once it has read them (one attempt, one read);
- any other job: when it ends for good (``end_job``: its status.json), a queued job removed or failed included;
- a Slurm job (Slurm may requeue a run that ended): once Slurm says the job ended (the store, on its final record).

This module must stay stdlib-only and Python 3.8 compatible.
"""

import os
import re
import shutil
from typing import Any, Dict, List

from ..fsutil import read_json, write_json

DIR, FILE = "secrets", "values.json"
#: Most secrets one job may have, longest name and longest value (bytes of UTF-8).
MAX_SECRETS, MAX_NAME, MAX_VALUE = 64, 128, 64 * 1024
NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,%d}" % (MAX_NAME - 1))  # (fullmatch: ``$`` would let a newline end it)


def check(secrets: Any) -> Dict[str, str]:
    """The ``secrets`` of a start request, checked; ValueError naming what is wrong (a name, never a value)."""
    if secrets is None:
        return {}
    if not isinstance(secrets, dict) or len(secrets) > MAX_SECRETS:
        raise ValueError("secrets must map at most %d variable names to strings" % MAX_SECRETS)
    for name, value in secrets.items():
        if not isinstance(name, str) or not NAME.fullmatch(name):
            raise ValueError("secret name %r: use letters, digits and _ (not first), at most %d" % (
                str(name)[:MAX_NAME], MAX_NAME))
        if not isinstance(value, str) or "\x00" in value or len(value.encode("utf-8", "replace")) > MAX_VALUE:
            raise ValueError("secret %s: its value must be a string of at most %d bytes, without NUL" % (name, MAX_VALUE))
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:  # a lone surrogate: no environment can hold it
            raise ValueError("secret %s: its value is not valid text (UTF-8)" % name) from None
    return dict(secrets)


def keep(job_dir: str, secrets: Dict[str, str]) -> None:
    """Write a new job's secrets (none: nothing is written)."""
    if not secrets:
        return
    path = os.path.join(job_dir, DIR)
    os.mkdir(path, 0o700)
    os.chmod(path, 0o700)  # mkdir's mode went through the umask
    write_json(os.path.join(path, FILE), secrets)


def load(job_dir: str, names: List[str]) -> Dict[str, str]:
    """The values of the job's secrets ``names``; ValueError naming those the host no longer has."""
    if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
        raise ValueError("the names of its secrets in job.json are damaged")
    values = read_json(os.path.join(job_dir, DIR, FILE)) if names else {}
    values = values if isinstance(values, dict) else {}
    missing = [n for n in names if not isinstance(values.get(n), str)]
    if missing:
        raise ValueError("its secrets %s are no longer on the host: start the job again" % ", ".join(missing))
    return {n: values[n] for n in names}


def forget(job_dir: str) -> None:
    """Delete the job's secrets (and a temp file a crash left beside them); nothing when it has none."""
    shutil.rmtree(os.path.join(job_dir, DIR), ignore_errors=True)


def end_job(job_dir: str, end: Dict[str, Any]) -> None:
    """End the job for good: write its status.json (``end``), then delete its secrets (it never starts again)."""
    write_json(os.path.join(job_dir, "status.json"), end)
    forget(job_dir)
