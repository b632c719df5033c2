"""Notifications sent from the host by the watchdog, with no client connected.

``config["notify"]`` (from the client's ``[notify]``): ``command`` (an argv run on the host; the text on its
stdin and in ``GPUTUI_NOTIFY_TEXT``, the event in ``GPUTUI_NOTIFY_EVENT``), ``webhook`` (an http(s) URL that
gets a JSON POST whose text is in ``text`` (Slack), ``content`` (Discord) and ``message`` (ntfy)), and
``ntfy`` (a topic: the plain text is POSTed to ``ntfy_server``/topic, https://ntfy.sh by default),
``idle_minutes`` (when the ``idle`` event fires) and ``events`` (which to send). Each event has a key; a key is sent once: ``notify_sent.json`` records the keys
delivered, ``notify_outbox.json`` the ones still owed, retried with backoff (``RETRY_S``) up to ``MAX_ATTEMPTS``.
Every attempt goes to the watchdog log. The text names the job by id and the name the user gave it only, never
its command line or environment. The watchdog sends through ``Sender`` (its own thread, a bounded queue, a
deadline for the whole of each send), so no endpoint holds up its loop.
"""

import json
import os
import queue as queue_mod
import re
import socket
import subprocess
import threading
import time
from typing import Any, Callable, Dict, List, Optional, Set, Tuple

from ..fsutil import read_json, write_json

EVENTS = (
    "job_succeeded",
    "job_failed",
    "job_killed",
    "job_lost",
    "stalled",
    "autostop_soon",
    "released",
    "release_failed",
    "release_check_failed",
    "queue_empty",
    "idle",
    "deadline_soon",
    "job_restarted",
    "crash_loop",
    "gpu_fault",
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
MAX_PER_PASS = 5  # sends waiting for the sender at most (its queue); the rest wait on disk for a later pass
TIMEOUT_S = 10.0  # the whole of one send through one channel (connect, TLS, request, answer), not per read
MAX_TEXT = 1000


def deliver(notify: Dict[str, Any], event: str, text: str, deadline_s: float = TIMEOUT_S) -> Optional[str]:
    """Send once through every configured channel, each within ``deadline_s`` in all; the first problem, or
    None when all went through."""
    problems = []
    topic = notify.get("ntfy")
    if topic:
        server = str(notify.get("ntfy_server") or NTFY_SERVER).rstrip("/")
        problem = post(server + "/" + str(topic), text.encode("utf-8"), "text/plain; charset=utf-8", "ntfy",
                       deadline_s)
        if problem:
            problems.append(problem)
    url = notify.get("webhook")
    if url:
        if not str(url).startswith(("http://", "https://")):
            problems.append("webhook must be an http or https URL")
        else:
            body = json.dumps({"text": text, "content": text, "message": text, "event": event}).encode()
            problem = post(url, body, "application/json", "webhook", deadline_s)
            if problem:
                problems.append(problem)
    argv = notify.get("command")
    if argv:
        env = dict(os.environ, GPUTUI_NOTIFY_EVENT=event, GPUTUI_NOTIFY_TEXT=text)
        try:
            res = subprocess.run(argv, input=text.encode(), capture_output=True, timeout=deadline_s, env=env)
            if res.returncode != 0:
                err = res.stderr.decode("utf-8", "replace").strip()[-300:]
                problems.append("command exited %d%s" % (res.returncode, ": " + err if err else ""))
        except subprocess.TimeoutExpired:
            problems.append("command did not finish within %g s" % deadline_s)
        except OSError as exc:
            problems.append("command cannot run: %s" % exc)
    if not url and not argv and not topic:
        problems.append("no webhook, ntfy topic or command configured")
    return "; ".join(problems) or None


def post(url: str, body: bytes, content_type: str, what: str, deadline_s: float = TIMEOUT_S) -> Optional[str]:
    """POST ``body``; the problem, or None when the server accepted it: a 2xx status within the deadline (the
    answer's body is never read: an endpoint that drips it after the status cannot turn a delivery into a failure).

    ``deadline_s`` bounds the whole exchange (connect, TLS, send, the answer's status and headers): when it
    passes, a timer shuts the socket, so an endpoint that drips a byte every few seconds cannot hold the
    sender (a per-read socket timeout would never fire). Only a name lookup that hangs outlasts it. A redirect
    is never followed (urllib turns a POST redirected by 302 into a GET without the body): 3xx is a failure.
    """
    import http.client  # here: most agents never send anything
    import urllib.parse

    parts = urllib.parse.urlsplit(url)
    try:
        host, port = parts.hostname, parts.port
    except ValueError as exc:
        return "%s failed: bad URL: %s" % (what, exc)
    if parts.scheme not in ("http", "https") or not host:
        return "%s failed: not an http or https URL" % what
    target = (parts.path or "/") + ("?" + parts.query if parts.query else "")
    proxy = _proxy(parts.scheme, host)
    conn_class = http.client.HTTPSConnection if parts.scheme == "https" else http.client.HTTPConnection
    if proxy is None:
        conn = conn_class(host, port, timeout=deadline_s)
    elif parts.scheme == "https":  # a CONNECT tunnel through the proxy
        conn = http.client.HTTPSConnection(proxy[0], proxy[1], timeout=deadline_s)
        conn.set_tunnel(host, port)
    else:  # a plain proxy gets the whole URL
        conn, target = http.client.HTTPConnection(proxy[0], proxy[1], timeout=deadline_s), url
    guard = _Guard(conn, deadline_s)
    headers = {"Content-Type": content_type, "User-Agent": "gputui"}
    try:
        conn.request("POST", target, body=body, headers=headers)
        resp = conn.getresponse()
        status, location = resp.status, resp.getheader("Location")
    except (OSError, http.client.HTTPException, ValueError) as exc:
        if isinstance(exc, socket.timeout):  # the socket's own timeout (also deadline_s) came before the timer's
            guard.expired.set()
        if not guard.expired.is_set():
            return "%s failed: %s" % (what, getattr(exc, "reason", None) or exc or type(exc).__name__)
    finally:
        guard.close()
        conn.close()
    if guard.expired.is_set():  # (headers cut short by the shutdown parse as complete ones)
        return "%s did not answer within %g s" % (what, deadline_s)
    if 300 <= status < 400:
        return "%s answered HTTP %d, a redirect to %s: not followed (a POST is never redirected)" % (
            what, status, clean(location or "nowhere")[:200],
        )
    if not 200 <= status < 300:
        return "%s answered HTTP %d" % (what, status)
    return None


def _proxy(scheme: str, host: str) -> Optional[Tuple[str, int]]:
    """(host, port) of the proxy the environment names for ``scheme`` (``https_proxy``...), unless ``host``
    bypasses it (``no_proxy``); None for a direct connection."""
    import urllib.parse
    import urllib.request

    url = urllib.request.getproxies().get(scheme)
    if not url or urllib.request.proxy_bypass(host):
        return None
    parts = urllib.parse.urlsplit(url if "://" in url else "http://" + url)
    try:
        port = parts.port
    except ValueError:
        return None
    return (parts.hostname, port or 8080) if parts.hostname else None


class _Guard:
    """Shuts a connection's socket when its deadline passes (shutting a dup of it wakes any read or write,
    TLS included, as the TLS socket takes over the same file)."""

    def __init__(self, conn: Any, deadline_s: float) -> None:
        self.expired = threading.Event()
        self._socks: List[socket.socket] = []
        self._lock = threading.Lock()
        create = conn._create_connection  # what HTTPConnection.connect calls to open its socket

        def create_guarded(*args: Any, **kwargs: Any) -> socket.socket:
            sock = create(*args, **kwargs)
            with self._lock:
                self._socks.append(sock.dup())
                late = self.expired.is_set()
            if late:  # the deadline passed while connecting
                sock.close()
                raise socket.timeout("deadline passed while connecting")
            return sock

        conn._create_connection = create_guarded
        self._timer = threading.Timer(deadline_s, self._expire)
        self._timer.daemon = True
        self._timer.start()

    def _expire(self) -> None:
        with self._lock:
            self.expired.set()
            for sock in self._socks:
                try:
                    sock.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass

    def close(self) -> None:
        self._timer.cancel()
        with self._lock:
            for sock in self._socks:
                sock.close()
            self._socks = []


class Sender:
    """Delivers notifications on its own thread, fed by a bounded queue, so that no endpoint, however slow,
    holds up the watchdog's loop (autostop, the queue's scheduling): ``submit`` never blocks, ``results`` hands
    back what was tried. At most ``capacity`` sends are outstanding; each takes at most about ``deadline_s`` per
    channel."""

    def __init__(self, capacity: int = MAX_PER_PASS, deadline_s: float = TIMEOUT_S) -> None:
        self.capacity, self.deadline_s = capacity, deadline_s
        self._todo = queue_mod.Queue(capacity)  # type: queue_mod.Queue
        self._done = queue_mod.Queue()  # type: queue_mod.Queue  # at most capacity + 1 (one in flight)
        self._keys: Set[str] = set()  # submitted, result not taken yet
        self._idle = threading.Condition()
        self._thread: Optional[threading.Thread] = None

    def submit(self, notify: Dict[str, Any], item: Dict[str, Any]) -> bool:
        """Hand ``item`` (an outbox entry) over for sending; False when the queue is full (try again later)."""
        key = str(item.get("key"))
        with self._idle:
            if key in self._keys:
                return True
            if len(self._keys) >= self.capacity:  # sending, waiting, or done but not collected yet
                return False
            self._todo.put_nowait((notify, item))
            self._keys.add(key)
        if self._thread is None:
            self._thread = threading.Thread(target=self._work, name="notify-sender", daemon=True)
            self._thread.start()
        return True

    def pending(self, key: str) -> bool:
        with self._idle:
            return key in self._keys

    def results(self) -> List[Tuple[Dict[str, Any], Optional[str]]]:
        """(item, problem or None) of each send finished since the last call."""
        out = []
        while True:
            try:
                item, problem = self._done.get_nowait()
            except queue_mod.Empty:
                return out
            with self._idle:
                self._keys.discard(str(item.get("key")))
            out.append((item, problem))

    def wait(self, timeout: float) -> bool:
        """Wait (at most ``timeout`` s) until every submitted send has finished; whether they all have."""
        end = time.monotonic() + timeout
        with self._idle:
            while len(self._keys) > self._done.qsize():
                left = end - time.monotonic()
                if left <= 0:
                    return False
                self._idle.wait(left)
        return True

    def _work(self) -> None:
        while True:
            notify, item = self._todo.get()
            try:
                problem = deliver(notify, str(item.get("event")), str(item.get("text")), self.deadline_s)
            except Exception as exc:  # the sender must go on
                problem = "cannot send: %r" % exc
            with self._idle:
                self._done.put((item, problem))
                self._idle.notify_all()


def clean(text: str) -> str:
    """One bounded line with no control characters (names come from the user and the host)."""
    return "".join(ch if ch.isprintable() else " " for ch in str(text))[:MAX_TEXT]


class Notifier:
    """The watchdog's notifications: queue an event once, hand what is owed to the sender, record the outcome
    (delivered, or backed off). Only the watchdog's thread touches the files; the sender only sends."""

    def __init__(self, state_dir: str, log: Callable[[str], None], sender: Optional[Sender] = None) -> None:
        self.state_dir = state_dir
        self.log = log
        self.sender = sender or Sender()

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
        """Record the sends that finished; hand every owed notification that is due to the sender (never
        waiting for it: what does not fit its queue waits for the next pass)."""
        self.collect()
        outbox, changed = self._outbox(), False
        for i, item in enumerate(outbox):
            key = str(item.get("key"))
            if float(item.get("next_at") or 0.0) > now or self.sender.pending(key):
                continue
            if not self.sender.submit(notify, dict(item, tried_at=now)):
                break  # the sender is busy: the rest wait
            outbox[i], changed = dict(item, tried_at=now), True
        if changed:
            write_json(self._path(OUTBOX), {"items": outbox})

    def collect(self) -> None:
        """Record the outcome of each finished send: delivered (or given up), or backed off."""
        done = self.sender.results()
        if not done:
            return
        outcome = {str(item.get("key")): (item, problem) for item, problem in done}
        outbox, keep, delivered = self._outbox(), [], []
        for item in outbox:
            key = str(item.get("key"))
            if key not in outcome:
                keep.append(item)
                continue
            tried, problem = outcome[key]
            attempt = int(item.get("attempts") or 0) + 1
            if problem is None:
                self.log("notify %s (%s): sent on attempt %d" % (key, item.get("event"), attempt))
                delivered.append(key)
            elif attempt >= MAX_ATTEMPTS:
                self.log("notify %s: giving up after %d attempts: %s" % (key, attempt, problem))
                delivered.append(key)  # never again: it is not owed any more
            else:
                wait = RETRY_S[min(attempt, len(RETRY_S)) - 1]
                self.log("notify %s: attempt %d failed (%s); retrying in %.0f s" % (key, attempt, problem, wait))
                keep.append(dict(item, attempts=attempt, next_at=float(tried.get("tried_at") or 0.0) + wait))
        if delivered:
            write_json(self._path(SENT), {"keys": (self._keys() + delivered)[-MAX_KEYS:]})
        write_json(self._path(OUTBOX), {"items": keep})

    def finish(self, timeout: float) -> None:
        """Before the watchdog exits: wait (at most ``timeout`` s) for the sends under way, and record them."""
        self.sender.wait(timeout)
        self.collect()


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
            name = given_name(job)
            error = str(job.get("error") or "")
            if state == "failed" and error.startswith("crash loop"):  # restart policies stopped a crash loop
                out.append({"key": "crash_loop:%s:%s" % (job.get("id"), ended), "event": "crash_loop",
                            "text": "job %s%s stopped restarting: %s" % (job.get("id"), " " + name if name else "",
                                                                       clean(error)[:500])})
                continue
            out.append({
                "key": "job_%s:%s:%s" % (state, job.get("id"), ended), "event": "job_" + str(state),
                "text": "job %s%s %s%s" % (job.get("id"), " " + name if name else "", state, tail),
            })
    return out + restart_events(jobs, since)


def restart_events(jobs: List[Dict[str, Any]], since: float) -> List[Dict[str, str]]:
    """``job_restarted`` for each attempt that ended at or after ``since`` and was followed by another."""
    out = []
    for job in jobs:
        attempts = job.get("attempts")
        if not isinstance(attempts, list):
            continue
        restarted = attempts if job.get("ended_at") is None else attempts[:-1]
        for a in restarted:
            ended = a.get("ended_at") if isinstance(a, dict) else None
            if not isinstance(ended, (int, float)) or ended < since:
                continue
            why = "exit %s" % a.get("exit_code") if a.get("exit_code") is not None else "lost"
            hint = clean(str(a.get("hint")))[:300] if a.get("hint") else None
            out.append({"key": "job_restarted:%s:%s" % (job.get("id"), a.get("attempt")), "event": "job_restarted",
                        "text": "job %s restarted after attempt %s ended (%s%s)" % (
                            job.get("id"), a.get("attempt"), why, ": " + hint if hint else "")})
    return out


def given_name(job: Dict[str, Any]) -> Optional[str]:
    """The name the user gave the job, or None: a job started without one is named after its command line
    (which may carry a password), and only a name that cannot be a piece of it is one a text may show. A record
    whose command is not there to compare (cut from an oversized listing) shows no name either."""
    name, argv = str(job.get("name") or "").strip(), job.get("argv")
    if not name or name == str(job.get("id")) or not isinstance(argv, list) or not argv:
        return None
    if job.get("argv_truncated"):
        argv = argv[:-1]  # the last one is the listing's "[command cut ...]" note
    command = re.sub(r"[\x00-\x1f\x7f]", " ", " ".join(str(a) for a in argv)).strip()
    if command.startswith(name) or name.startswith(command):
        return None
    return name


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
    ]
    if not queued and left:
        last = max(left, key=lambda j: int(j["id"]))
        out.append({"key": "queue_empty:%s" % last["id"], "event": "queue_empty",
                    "text": "the queue is empty (last job: %s)" % last["id"]})
    minutes = (config.get("notify") or {}).get("idle_minutes")
    if minutes and not state.get("reasons") and now - start >= float(minutes) * 60.0:
        out.append({"key": "idle:%s:%s" % (boot, start), "event": "idle",
                    "text": "host idle for %.0f min" % ((now - start) / 60.0)})
    release_at = state.get("release_at")  # the deadline in force (watchdog.deadline_at)
    if release_at is not None and 0.0 <= float(release_at) - now <= DEADLINE_SOON_S:
        out.append({"key": "deadline_soon:%s:%s" % (boot, release_at), "event": "deadline_soon",
                    "text": "deadline releases the host in %.0f min" % ((float(release_at) - now) / 60.0)})
    return out
