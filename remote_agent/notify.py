"""Notifications sent from the host by the watchdog, with no client connected.

``config["notify"]`` (from the client's ``[notify]``): ``command`` (an argv run on the host; the text on its
stdin and in ``GPUTUI_NOTIFY_TEXT``, the event in ``GPUTUI_NOTIFY_EVENT``), ``webhook`` (an http(s) URL that
gets a JSON POST whose text is in ``text`` (Slack), ``content`` (Discord) and ``message`` (ntfy)), and
``events`` (which to send). Each event has a key; a key is sent once: ``notify_sent.json`` records the keys
delivered, ``notify_outbox.json`` the ones still owed, retried with backoff (``RETRY_S``) up to ``MAX_ATTEMPTS``.
Every attempt goes to the watchdog log. The text names the job by id and name only, never its environment.
"""

import json
import os
import subprocess
from typing import Any, Callable, Dict, List, Optional

from .fsutil import read_json, write_json

EVENTS = (
    "job_succeeded",
    "job_failed",
    "job_killed",
    "job_lost",
    "stalled",
    "autostop_soon",
    "released",
    "test",
)
SOON_S = 600.0  # autostop_soon: sent once per idle stretch when the release is at most this far off
SENT, OUTBOX = "notify_sent.json", "notify_outbox.json"
RETRY_S = (5.0, 30.0, 120.0, 600.0)  # waits after the 1st, 2nd, ... failure (the last one repeats)
MAX_ATTEMPTS = 8
MAX_KEYS = 2000  # delivered keys remembered (oldest dropped)
MAX_OUTBOX = 200
MAX_PER_PASS = 5  # attempts per watchdog pass: a slow endpoint must not hold up autostop for long
TIMEOUT_S = 10.0
MAX_TEXT = 1000


def deliver(notify: Dict[str, Any], event: str, text: str) -> Optional[str]:
    """Send once through every configured channel; the first problem, or None when all went through."""
    problems = []
    url = notify.get("webhook")
    if url:
        if not str(url).startswith(("http://", "https://")):
            problems.append("webhook must be an http or https URL")
        else:
            import urllib.error  # here: 50 ms to import, and most agents never send a webhook
            import urllib.request

            body = json.dumps({"text": text, "content": text, "message": text, "event": event}).encode()
            req = urllib.request.Request(
                url, data=body, method="POST", headers={"Content-Type": "application/json"}
            )
            try:
                with urllib.request.urlopen(req, timeout=TIMEOUT_S) as resp:
                    resp.read(4096)
            except urllib.error.HTTPError as exc:
                problems.append("webhook answered HTTP %d" % exc.code)
            except (urllib.error.URLError, OSError, ValueError) as exc:
                problems.append("webhook failed: %s" % getattr(exc, "reason", exc))
    argv = notify.get("command")
    if argv:
        env = dict(os.environ, GPUTUI_NOTIFY_EVENT=event, GPUTUI_NOTIFY_TEXT=text)
        try:
            res = subprocess.run(
                argv, input=text.encode(), capture_output=True, timeout=TIMEOUT_S * 3, env=env
            )
            if res.returncode != 0:
                err = res.stderr.decode("utf-8", "replace").strip()[-300:]
                problems.append("command exited %d%s" % (res.returncode, ": " + err if err else ""))
        except subprocess.TimeoutExpired:
            problems.append("command timed out")
        except OSError as exc:
            problems.append("command cannot run: %s" % exc)
    if not url and not argv:
        problems.append("no webhook or command configured")
    return "; ".join(problems) or None


def clean(text: str) -> str:
    """One bounded line with no control characters (names come from the user and the host)."""
    return "".join(ch if ch.isprintable() else " " for ch in str(text))[:MAX_TEXT]


class Notifier:
    """The watchdog's notifications: queue an event once, deliver what is owed, with backoff."""

    def __init__(self, state_dir: str, log: Callable[[str], None]) -> None:
        self.state_dir = state_dir
        self.log = log

    def _path(self, name: str) -> str:
        return os.path.join(self.state_dir, name)

    def _keys(self) -> List[str]:
        sent = read_json(self._path(SENT)) or {}
        keys = sent.get("keys") if isinstance(sent, dict) else None
        return [str(k) for k in keys] if isinstance(keys, list) else []

    def _outbox(self) -> List[Dict[str, Any]]:
        box = read_json(self._path(OUTBOX)) or {}
        items = box.get("items") if isinstance(box, dict) else None
        return [i for i in items if isinstance(i, dict)] if isinstance(items, list) else []

    def queue(self, notify: Dict[str, Any], events: List[Dict[str, str]], now: float) -> None:
        """Owe each event (``{"key", "event", "text"}``) once, when the settings ask for its kind."""
        wanted = [e for e in events if e["event"] in (notify.get("events") or ())]
        if not wanted:
            return
        outbox = self._outbox()
        known = set(self._keys()) | {str(i.get("key")) for i in outbox}
        new = [e for e in wanted if e["key"] not in known]
        if new:
            outbox += [dict(e, text=clean(e["text"]), attempts=0, next_at=now) for e in new]
            write_json(self._path(OUTBOX), {"items": outbox[-MAX_OUTBOX:]})

    def flush(self, notify: Dict[str, Any], now: float) -> None:
        """Try every owed notification that is due; record the delivered ones, back off the others."""
        outbox, keep = self._outbox(), []
        delivered, tried = [], 0
        for item in outbox:
            if float(item.get("next_at") or 0.0) > now or tried >= MAX_PER_PASS:
                keep.append(item)
                continue
            attempt, tried = int(item.get("attempts") or 0) + 1, tried + 1
            problem = deliver(notify, str(item.get("event")), str(item.get("text")))
            if problem is None:
                self.log("notify %s (%s): sent on attempt %d" % (item["key"], item["event"], attempt))
                delivered.append(str(item["key"]))
                continue
            if attempt >= MAX_ATTEMPTS:
                self.log("notify %s: giving up after %d attempts: %s" % (item["key"], attempt, problem))
                delivered.append(str(item["key"]))  # never again: it is not owed any more
                continue
            wait = RETRY_S[min(attempt, len(RETRY_S)) - 1]
            self.log(
                "notify %s: attempt %d failed (%s); retrying in %.0f s"
                % (item["key"], attempt, problem, wait)
            )
            keep.append(dict(item, attempts=attempt, next_at=now + wait))
        if delivered:
            write_json(self._path(SENT), {"keys": (self._keys() + delivered)[-MAX_KEYS:]})
        if keep != outbox:
            write_json(self._path(OUTBOX), {"items": keep})


def checked(notify: Any) -> Dict[str, Any]:
    """The notify settings as the watchdog keeps them; ValueError says what is wrong."""
    if not isinstance(notify, dict):
        raise ValueError("notify must be an object")
    url, argv, events = notify.get("webhook"), notify.get("command"), notify.get("events") or []
    if url is not None and not (isinstance(url, str) and url.startswith(("http://", "https://"))):
        raise ValueError("notify.webhook must be an http or https URL")
    if argv is not None and not (isinstance(argv, list) and argv and all(isinstance(a, str) for a in argv)):
        raise ValueError("notify.command must be a non-empty list of strings")
    if not isinstance(events, list) or any(e not in EVENTS for e in events):
        raise ValueError("notify.events must be a list of: %s" % ", ".join(EVENTS))
    host = notify.get("host")
    return {
        "webhook": url,
        "command": argv,
        "events": events,
        "host": clean(host) if isinstance(host, str) else None,
    }


def enabled(notify: Any) -> bool:
    """Whether ``notify`` settings ask for anything: some event and a way to send it."""
    return (
        isinstance(notify, dict)
        and bool(notify.get("events"))
        and bool(notify.get("webhook") or notify.get("command"))
    )


def job_events(jobs: List[Dict[str, Any]], since: float) -> List[Dict[str, str]]:
    """``{"key", "event", "text"}`` for each job that ended at or after ``since`` (an older end is history)."""
    out = []
    for job in jobs:
        state = job.get("state")
        ended = job.get("ended_at") or (job.get("started_at") if state == "lost" else None)  # lost: no end
        if (
            state in ("succeeded", "failed", "killed", "lost")
            and isinstance(ended, (int, float))
            and ended >= since
        ):
            code = job.get("exit_code")
            tail = "" if code is None or state == "lost" else " (exit %s)" % code
            name = job.get("name") or job.get("id")
            out.append({
                "key": "job_%s:%s:%s" % (state, job.get("id"), ended), "event": "job_" + str(state),
                "text": "job %s %s %s%s" % (job.get("id"), name, state, tail),
            })  # fmt: skip
    return out
