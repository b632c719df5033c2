"""Notifications sent from the host by the watchdog, with no client connected.

``config["notify"]`` (from the client's ``[notify]``): ``command`` (an argv run on the host; the text on its
stdin and in ``GPUTUI_NOTIFY_TEXT``, the event in ``GPUTUI_NOTIFY_EVENT``), ``webhook`` (an http(s) URL that
gets a JSON POST whose text is in ``text`` (Slack), ``content`` (Discord) and ``message`` (ntfy)), and
``ntfy`` (a topic: the plain text is POSTed to ``ntfy_server``/topic, https://ntfy.sh by default),
``idle_minutes`` (when the ``idle`` event fires) and ``events`` (which to send). Each event has a key; a key is sent once: ``notify_sent.json`` records the keys
delivered, ``notify_outbox.json`` the ones still owed, retried with backoff (``RETRY_S``) up to ``MAX_ATTEMPTS``.
Every attempt goes to the watchdog log. The text names the job by id and name only, never its environment.
"""

import json
import os
import re
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
    "queue_empty",
    "idle",
    "deadline_soon",
    "test",
)
SOON_S = 600.0  # autostop_soon: sent once per idle stretch when the release is at most this far off
DEADLINE_SOON_S = 3600.0  # deadline_soon: sent once per deadline when it is at most this far off
NTFY_SERVER = "https://ntfy.sh"
_TOPIC = re.compile(r"^[A-Za-z0-9_-]{1,64}$")
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
    topic = notify.get("ntfy")
    if topic:
        server = str(notify.get("ntfy_server") or NTFY_SERVER).rstrip("/")
        problem = _post(server + "/" + str(topic), text.encode("utf-8"), "text/plain; charset=utf-8", "ntfy")
        if problem:
            problems.append(problem)
    url = notify.get("webhook")
    if url:
        if not str(url).startswith(("http://", "https://")):
            problems.append("webhook must be an http or https URL")
        else:
            body = json.dumps({"text": text, "content": text, "message": text, "event": event}).encode()
            problem = _post(url, body, "application/json", "webhook")
            if problem:
                problems.append(problem)
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
    if not url and not argv and not topic:
        problems.append("no webhook, ntfy topic or command configured")
    return "; ".join(problems) or None


def _post(url: str, body: bytes, content_type: str, what: str) -> Optional[str]:
    """POST ``body``; the problem, or None when the server accepted it."""
    import urllib.error  # here: 50 ms to import, and most agents never send anything
    import urllib.request

    req = urllib.request.Request(url, data=body, method="POST", headers={"Content-Type": content_type})
    try:
        with urllib.request.urlopen(req, timeout=TIMEOUT_S) as resp:
            resp.read(4096)
    except urllib.error.HTTPError as exc:
        return "%s answered HTTP %d" % (what, exc.code)
    except (urllib.error.URLError, OSError, ValueError) as exc:
        return "%s failed: %s" % (what, getattr(exc, "reason", exc))
    return None


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
    topic, server, idle = notify.get("ntfy"), notify.get("ntfy_server"), notify.get("idle_minutes")
    if topic is not None and not (isinstance(topic, str) and _TOPIC.match(topic)):
        raise ValueError("notify.ntfy must be a topic name (letters, digits, - and _)")
    if server is not None and not (isinstance(server, str) and server.startswith(("http://", "https://"))):
        raise ValueError("notify.ntfy_server must be an http or https URL")
    if idle is not None and (isinstance(idle, bool) or not isinstance(idle, (int, float)) or not 0 < idle <= 1e6):
        raise ValueError("notify.idle_minutes must be a number of minutes above 0")
    host = notify.get("host")
    return {
        "webhook": url,
        "command": argv,
        "ntfy": topic,
        "ntfy_server": server,
        "idle_minutes": idle,
        "events": events,
        "host": clean(host) if isinstance(host, str) else None,
    }


def enabled(notify: Any) -> bool:
    """Whether ``notify`` settings ask for anything: some event and a way to send it."""
    return (
        isinstance(notify, dict)
        and bool(notify.get("events"))
        and bool(notify.get("webhook") or notify.get("command") or notify.get("ntfy"))
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


def host_events(
    config: Dict[str, Any], state: Dict[str, Any], jobs: List[Dict[str, Any]], start: float, now: float
) -> List[Dict[str, str]]:
    """The queue, idle and deadline events of a watchdog pass: each keyed so that it is sent once.

    ``start``: when the current idle stretch began for autostop (see watchdog.window_start).
    """
    out = []
    boot, armed = config.get("boot_id"), float(config.get("armed_at") or 0.0)
    queued = [j for j in jobs if j.get("state") == "queued"]
    left = [
        j for j in jobs
        if isinstance(j.get("queue"), dict) and j.get("state") != "queued"
        and max(float(j.get("dequeued_at") or 0.0), float(j.get("ended_at") or 0.0)) >= armed
    ]  # fmt: skip
    if not queued and left:
        last = max(left, key=lambda j: int(j["id"]))
        out.append({"key": "queue_empty:%s" % last["id"], "event": "queue_empty",
                    "text": "the queue is empty (last job: %s)" % last["id"]})  # fmt: skip
    minutes = (config.get("notify") or {}).get("idle_minutes")
    if minutes and not state.get("reasons") and now - start >= float(minutes) * 60.0:
        out.append({"key": "idle:%s:%s" % (boot, start), "event": "idle",
                    "text": "host idle for %.0f min" % ((now - start) / 60.0)})  # fmt: skip
    release_at = state.get("release_at")  # the deadline in force (watchdog.deadline_at)
    if release_at is not None and 0.0 <= float(release_at) - now <= DEADLINE_SOON_S:
        out.append({"key": "deadline_soon:%s:%s" % (boot, release_at), "event": "deadline_soon",
                    "text": "deadline releases the host in %.0f min" % ((float(release_at) - now) / 60.0)})  # fmt: skip
    return out
