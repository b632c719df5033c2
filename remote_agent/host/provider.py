"""Where the agent runs (RunPod, vast.ai, or neither) and the provider's own REST API: price, state, release.

Runs on the GPU host: stdlib only, Python >= 3.8. Nothing here releases anything by itself; ``release`` is
called only by code that the user's settings asked to release.

Detection (``detect``) looks, in this order, at the agent's own environment, ``/etc/rp_environment`` and
``/etc/environment`` (``export K=V`` / ``K=V`` lines), then ``/proc/1/environ``. RunPod and vast.ai put the
instance id and an instance-scoped key in the environment of the container's PID 1 only (RunPod's start script
copies them to ``/etc/rp_environment`` for interactive shells), so a non-interactive SSH session has none:
``RUNPOD_POD_ID`` + ``RUNPOD_API_KEY`` (RunPod), ``CONTAINER_ID`` + ``CONTAINER_API_KEY`` (vast.ai). The
result (``Detected``) names the provider, the instance id and where they were found, never the key: every
call that needs the key reads it again from that same place and keeps it in its own frame (it is never
logged, returned, or put in an error message; an answer that echoes it has it cut out).

The APIs, as their references document them (checked 2026-12):

- RunPod REST v1, ``https://rest.runpod.io/v1``, header ``Authorization: Bearer KEY``
  (docs.runpod.io/api-reference/pods/GET/pods/podId, .../POST/pods/podId/stop, .../DELETE/pods/podId).
  ``GET /pods/{id}`` answers a Pod: ``desiredStatus`` (``RUNNING``, ``EXITED``, ``TERMINATED``), ``costPerHr``
  (the reference's example gives it as a string, ``"0.74"``, other clients as a number: both are read),
  ``lastStartedAt`` (ISO time), ``networkVolumeId`` (a pod with a network volume has no "Stop": it can only be
  terminated, docs "Pod storage"). Stop keeps the volume disk (billed at its stopped rate) and wipes the
  container disk; terminate deletes the pod and its volume disk (a network volume survives and bills on).
  ``POST /pods/{id}/start`` starts a stopped pod. Where its SSH answers: ``publicIp`` and ``portMappings``
  (``{"22": 10341}``, the public port of each exposed port; a start gives new ones); ``interruptible`` (a spot
  pod); ``gpu.count`` (a pod restarted on a full machine may come back with 0 GPUs); ``volumeInGb``, billed
  while stopped at RunPod's documented rate for a stopped pod's volume disk, ``RUNPOD_STOPPED_GB_MONTH``.
- vast.ai v0, ``https://console.vast.ai/api/v0``, header ``Authorization: Bearer KEY``
  (docs.vast.ai/api-reference/instances/show-instance, manage-instance, destroy-instance).
  ``GET /instances/{id}/`` answers ``{"instances": {...}}`` with ``actual_status`` (``running``, ``stopped``,
  ``loading``, ``frozen``, ``exited``, ... or null), ``cur_state`` (the machine contract: ``running`` /
  ``stopped``), ``dph_total`` ($/h, a number) and ``start_date`` (epoch seconds). ``PUT /instances/{id}/``
  with ``{"state": "stopped"}`` stops it (no GPU charges; the disk bills on), ``DELETE /instances/{id}/``
  destroys it; both answer ``{"success": true}``; ``{"state": "running"}`` starts a stopped one. Where its SSH
  answers: ``public_ipaddr`` with ``ports["22/tcp"][0]["HostPort"]`` (direct) and ``ssh_host``/``ssh_port``
  (vast.ai's relay); ``is_bid`` (an interruptible instance, stopped when outbid); ``num_gpus``;
  ``disk_space`` (GB) x ``storage_cost`` (USD per GB-month) is what its disk bills, stopped or not.

Every call has a TOTAL deadline (connect, headers and body together: a dripping answer cannot stretch it), an
API base that is a parameter (tests, proxies; plain http only to a loopback address, as the key travels in a
header), never follows a redirect (a 3xx is an error that names its Location), reads at most ``MAX_BODY``
bytes, and checks every field it uses by type (``Fields``): a field an action needs (``NEEDS``) that a broken
or hostile API gave unusably is a ``ProviderError``, never a traceback; one it does not need (a price, display
only) reads as unknown and never blocks it. Every error text from the HTTP layer goes through ``redact``.
``http.client`` (what urllib itself uses) is used directly so that no redirect handler, proxy setting or
per-read timeout can get in the way.
"""

import datetime
import json
import math
import os
import re
import socket
import threading
import time
import urllib.parse
from typing import TYPE_CHECKING, Any, Callable, Dict, Iterable, List, NamedTuple, Optional, Tuple

if TYPE_CHECKING:
    import http.client

RUNPOD, VASTAI, NONE = "runpod", "vastai", "none"
API_URLS = {RUNPOD: "https://rest.runpod.io/v1", VASTAI: "https://console.vast.ai/api/v0"}
# provider: (instance id variable, key variable, what a valid id looks like)
VARIABLES = {
    RUNPOD: ("RUNPOD_POD_ID", "RUNPOD_API_KEY", re.compile(r"^[A-Za-z0-9]{1,64}$")),
    VASTAI: ("CONTAINER_ID", "CONTAINER_API_KEY", re.compile(r"^[0-9]{1,20}$")),
}
ENV_FILES = ("/etc/rp_environment", "/etc/environment")
PROC_ENVIRON = "/proc/1/environ"
ENVIRONMENT = "environment"  # Detected.source when the agent's own environment had them
MAX_ENV_FILE = 256 * 1024  # bytes read of an env file
MAX_PROC_ENVIRON = 1024 * 1024  # bytes read of /proc/1/environ (Linux caps a process's env near this)
KEY_SHAPE = re.compile(r"[\x21-\x7e]{8,512}\Z")  # with .match: printable ASCII, no spaces (what a header holds)
MAX_BODY = 1024 * 1024
DEADLINE_S = 20.0
MAX_PRICE = 10000.0  # $/h: above this the figure is not a price
MAX_EPOCH = 253402300800.0  # year 10000: a later "time" is not one
MODES = ("stop", "terminate")
RUNPOD_STOPPED_GB_MONTH = 0.20  # USD per GB-month of a stopped pod's volume disk (runpod.io/pricing, 2026-12)
HOURS_PER_MONTH = 730.0
_ADDRESS = re.compile(r"^[A-Za-z0-9_.:-]{1,253}$")  # a host name or an IP address, nothing else
_DONE = {"stop": "stopped", "terminate": "terminated"}
# Normalised states: the bill stops at STOPPED (the disk may bill on) and at TERMINATED.
RUNNING, STARTING, STOPPED, TERMINATED, OTHER = "running", "starting", "stopped", "terminated", "other"


class ProviderError(Exception):
    """A provider call that did not do what it was for. ``kind`` says what went wrong:

    ``auth`` (key refused), ``not_found`` (no such instance), ``rate_limited``, ``server`` (5xx), ``timeout``,
    ``network``, ``redirect``, ``bad_answer`` (not the documented shape), ``unsupported`` (the provider cannot do
    that mode for this instance), ``config`` (a bad argument), ``unconfirmed`` (never reached the state asked),
    ``refused`` (the provider would not start the instance, in its words)."""

    RETRYABLE = ("rate_limited", "server", "timeout", "network")

    def __init__(self, kind: str, message: str, status: Optional[int] = None) -> None:
        super().__init__(message)
        self.kind = kind
        self.status = status  # the HTTP status of an answer of a status no call expects

    @property
    def retryable(self) -> bool:
        """Whether trying again later may help (the watchdog's backoff)."""
        return self.kind in self.RETRYABLE


class Detected(NamedTuple):
    """Where the agent runs: ``provider`` (runpod / vastai / none), the provider's ``instance_id``, the
    ``source`` the id and key were found in (``environment`` or a file path) and a ``note`` on anything half
    found (an id without its key, a malformed id). Never the key."""

    provider: str
    instance_id: str = ""
    source: str = ""
    note: str = ""


class Instance(NamedTuple):
    """One instance as its provider reports it now."""

    provider: str
    instance_id: str
    state: str  # running / starting / stopped / terminated / other (see the module's constants)
    provider_state: str  # the provider's own word, e.g. "EXITED", "loading"
    price_per_hour: Optional[float]  # the provider's figure in USD per hour (None: it gave none usable)
    started_at: Optional[float]  # epoch seconds the current run started, where the provider says
    can_stop: bool  # False only where the answer shows "stop" is impossible (only terminate)
    why_no_stop: str = ""  # why not, in words
    unusable: Tuple[Tuple[str, str], ...] = ()  # (field of this tuple, why) for each value given unusably
    # What the client reads from here with the user's key (gputui start, a host that dropped): where its SSH
    # answers, as (kind, address, port) with kind "direct" or "proxy" (vast.ai's ssh*.vast.ai relay); whether
    # the provider may reclaim it (spot / interruptible / a vast.ai bid); its GPUs; what its disk bills while
    # it is stopped (USD per hour).
    endpoints: Tuple[Tuple[str, str, int], ...] = ()
    interruptible: Optional[bool] = None
    gpus: Optional[int] = None
    stopped_per_hour: Optional[float] = None

    def needed(self, action: str) -> "Instance":
        """This instance, when every field ``action`` needs (``NEEDS``) was usable; else a ``ProviderError``
        naming those fields. The others (a price: display only) never decide it."""
        bad = [why for name, why in self.unusable if name in NEEDS[action]]
        if bad:
            raise ProviderError("bad_answer", "; ".join(bad))
        return self


# What each action needs of an instance read back (besides its id, always checked): a field of ``Instance``
# the answer gave unusably fails only the actions that need it. A release needs the instance only (a "stop"
# the provider cannot do is refused by the provider, loudly); a check and a confirm need its state; a status
# display needs nothing (an unusable price shows as "price unknown").
NEEDS: Dict[str, Tuple[str, ...]] = {
    "status": (), "release": (), "check": ("state",), "confirm": ("state",), "start": ("state",),
}


class Confirmed(NamedTuple):
    """A release the provider confirmed: the state it reached and how many reads it took."""

    state: str
    polls: int
    how: str  # e.g. "runpod reports desiredStatus EXITED"


# ---- detection ---------------------------------------------------------------------------------------------


def _wanted() -> Tuple[str, ...]:
    return tuple(name for pair in VARIABLES.values() for name in pair[:2])


def _unquote(value: str) -> str:
    value = value.strip()
    if len(value) >= 2 and value[0] == value[-1] and value[0] in "'\"":
        return value[1:-1]
    return value.split(" #", 1)[0].strip()  # an unquoted value ends at a comment


def parse_env_file(text: str, keys: Iterable[str]) -> Dict[str, str]:
    """``K=V`` / ``export K=V`` lines (quotes optional, ``#`` comments) of ``text``: only the given keys."""
    wanted, out = set(keys), {}
    for raw in text.splitlines():
        line = raw.strip()
        if line.startswith("export "):
            line = line[len("export ") :].lstrip()
        name, sep, value = line.partition("=")
        if sep and name.strip() in wanted:
            out[name.strip()] = _unquote(value)
    return out


def parse_environ(data: bytes, keys: Iterable[str]) -> Dict[str, str]:
    """A NUL-separated environment block (``/proc/PID/environ``): only the given keys."""
    wanted, out = {k.encode() for k in keys}, {}
    for item in data.split(b"\0"):
        name, sep, value = item.partition(b"=")
        if sep and name in wanted:
            out[name.decode()] = value.decode("utf-8", "replace")
    return out


def _read_bounded(path: str, limit: int) -> Optional[bytes]:
    """At most ``limit`` bytes of a regular file (or a /proc file); None when it cannot be read."""
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0))
    except OSError:
        return None
    try:
        chunks, size = [], 0
        while size < limit:
            chunk = os.read(fd, min(65536, limit - size))
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
        return b"".join(chunks)
    except OSError:
        return None
    finally:
        os.close(fd)


def _source_values(source: str, env: Optional[Dict[str, str]]) -> Dict[str, str]:
    """The provider variables found in one source: ``environment``, or a file (NUL-separated like
    ``/proc/1/environ``, else ``K=V`` lines), each trimmed of surrounding whitespace (a key written with a
    trailing newline is still that key: a header cannot hold the newline)."""
    keys = _wanted()
    if source == ENVIRONMENT:
        environ = os.environ if env is None else env
        values = {k: environ[k] for k in keys if k in environ}
    else:
        data = _read_bounded(source, MAX_PROC_ENVIRON) or b""
        if b"\0" in data:
            values = parse_environ(data, keys)
        else:
            values = parse_env_file(data[:MAX_ENV_FILE].decode("utf-8", "replace"), keys)
    return {k: v.strip() for k, v in values.items()}


def detect(
    env: Optional[Dict[str, str]] = None,
    env_files: Iterable[str] = ENV_FILES,
    proc_environ: str = PROC_ENVIRON,
) -> Detected:
    """The provider this host runs on: the first source holding a provider's id AND key together wins.

    ``env`` (default: ``os.environ``), ``env_files`` and ``proc_environ`` are parameters for tests only."""
    notes = []
    for source in (ENVIRONMENT, *env_files, proc_environ):
        values = _source_values(source, env)
        for provider, (id_name, key_name, id_shape) in VARIABLES.items():
            instance_id, key = values.get(id_name, ""), values.get(key_name, "")
            if not instance_id and not key:
                continue
            where = "the environment" if source == ENVIRONMENT else source
            if not id_shape.match(instance_id):
                notes.append(
                    f"{id_name} in {where} is {'missing' if not instance_id else 'not an instance id'}"
                )
            elif not KEY_SHAPE.match(key):
                notes.append(f"{key_name} in {where} is {'missing' if not key else 'not an API key'}")
            else:
                return Detected(provider, instance_id, source)
    return Detected(NONE, note="; ".join(notes[:4]))


def _key_of(detected: Detected, env: Optional[Dict[str, str]]) -> str:
    """The instance's key, read again from where ``detect`` found it (never stored beyond the caller's call)."""
    if detected.provider not in VARIABLES:
        raise ProviderError("config", f"no provider API on this host (provider {detected.provider!r})")
    id_name, key_name, _ = VARIABLES[detected.provider]
    values = _source_values(detected.source, env)
    where = "the environment" if detected.source == ENVIRONMENT else detected.source
    if values.get(id_name) != detected.instance_id or not values.get(key_name):
        raise ProviderError("auth", f"{key_name} for instance {detected.instance_id} is no longer in {where}")
    return usable_key(values[key_name], key_name, where)


def usable_key(value: str, name: str, where: str) -> str:
    """``value`` fit for an ``Authorization`` header: surrounding whitespace (a trailing newline) trimmed; a
    key with any other character a header cannot hold is a ``ProviderError("config")`` that names ``name`` and
    ``where`` it was found, never the value."""
    key = value.strip()
    if not KEY_SHAPE.match(key):
        raise ProviderError(
            "config", f"{name} in {where} is not an API key (8 to 512 printable characters, no spaces)"
        )
    return key


# ---- HTTP ----------------------------------------------------------------------------------------------------

_LOOPBACK = re.compile(r"^(127\.\d{1,3}\.\d{1,3}\.\d{1,3}|localhost|::1)$")


def redact(text: str, *secrets: str) -> str:
    """``text`` with each secret replaced by ``***`` in every form an error text may hold it: as is, trimmed,
    as Python shows it in a str or bytes repr (``Invalid header value b'Bearer KEY\\n'``), URL-quoted. Every
    error path from the HTTP layer goes through this (``_clean``)."""
    forms = set()
    for secret in secrets:
        for form in (secret, secret.strip()):
            forms.update((form, repr(form)[1:-1], repr(form.encode("utf-8", "replace"))[2:-1],
                          urllib.parse.quote(form, safe=""), urllib.parse.quote_plus(form)))
    for form in sorted((f for f in forms if len(f) >= 4), key=len, reverse=True):
        text = text.replace(form, "***")
    return text


def _clean(text: str, secret: str = "", limit: int = 200) -> str:
    """Provider text fit for an error message: the key redacted, control characters replaced, shortened."""
    text = "".join(ch if ch.isprintable() else "?" for ch in redact(text, secret))
    return text if len(text) <= limit else text[:limit] + "..."


def check_api_url(url: str) -> str:
    """``url`` without a trailing slash, or ``ProviderError("config")``: https, or http to a loopback address
    only (the key travels in a header), no credentials, query or fragment."""
    parts = urllib.parse.urlsplit(url) if isinstance(url, str) else None
    if parts is None or parts.scheme not in ("https", "http") or not parts.hostname:
        raise ProviderError("config", f"API URL must be an https:// URL, not {_clean(str(url))!r}")
    if parts.scheme == "http" and not _LOOPBACK.match(parts.hostname):
        raise ProviderError("config", f"API URL {_clean(url)!r}: plain http only to a loopback address")
    if parts.username or parts.password or parts.query or parts.fragment:
        raise ProviderError(
            "config", f"API URL {_clean(url)!r} must not hold credentials, a query or a fragment"
        )
    return url.rstrip("/")


def http_json(
    method: str,
    url: str,
    key: str,
    body: Optional[Dict[str, Any]] = None,
    deadline_s: float = DEADLINE_S,
    max_body: int = MAX_BODY,
) -> Tuple[int, Any]:
    """One JSON call with ``Authorization: Bearer KEY``: (status, the decoded JSON, None for an empty body).
    2xx, 404 and 409 come back; anything else is a ``ProviderError``.

    ``deadline_s`` bounds the whole call, name lookup, connect, headers and body together: the exchange runs
    in a worker thread that is waited for that long, and a timer shuts its socket when the time is up (so a
    dripping answer cannot stretch it; only a hung name lookup can outlive it, in the background)."""
    check_api_url(url)
    parts = urllib.parse.urlsplit(url)
    what = f"{method} {parts.hostname}{parts.path}"
    if not isinstance(key, str) or not KEY_SHAPE.match(key):
        raise ProviderError("config", f"{what}: the API key holds a character a header cannot hold (not sent)")
    headers = {"Authorization": "Bearer " + key, "Accept": "application/json", "User-Agent": "gputui-agent"}
    payload = None
    if body is not None:
        payload = json.dumps(body).encode()
        headers["Content-Type"] = "application/json"
    box: List[Any] = []

    def work() -> None:
        try:
            box.append(_exchange(parts, method, payload, headers, deadline_s, max_body, what))
        except ProviderError as exc:
            box.append(exc)
        except Exception as exc:  # noqa: BLE001  (OSError, HTTPException, ValueError, ...: never a traceback)
            box.append(
                ProviderError("network", f"{what}: {_clean(type(exc).__name__ + ': ' + str(exc), key)}")
            )

    worker = threading.Thread(target=work, name="provider-call", daemon=True)
    worker.start()
    worker.join(deadline_s + 0.5)
    if not box:
        raise ProviderError("timeout", f"{what}: no complete answer within {deadline_s:g} s")
    if isinstance(box[0], ProviderError):
        raise box[0]
    status, data, location, retry_after = box[0]
    return status, _decode(status, data, what, key, location, retry_after)


def _exchange(
    parts: "urllib.parse.SplitResult", method: str, payload: Optional[bytes], headers: Dict[str, str],
    deadline_s: float, max_body: int, what: str,
) -> Tuple[int, bytes, str, str]:
    """The request and the whole answer: (status, body, Location, Retry-After), within ``deadline_s``."""
    end = time.monotonic() + deadline_s
    host, port = parts.hostname or "", parts.port
    import http.client
    import ssl

    conn: "http.client.HTTPConnection"
    if parts.scheme == "https":
        conn = http.client.HTTPSConnection(
            host, port, timeout=deadline_s, context=ssl.create_default_context()
        )
    else:
        conn = http.client.HTTPConnection(host, port, timeout=deadline_s)
    expired = threading.Event()

    def cut() -> None:
        expired.set()
        sock = conn.sock
        if sock is not None:
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    timer = threading.Timer(deadline_s, cut)
    timer.daemon = True
    timer.start()
    try:
        conn.request(method, parts.path or "/", body=payload, headers=headers)
        resp = conn.getresponse()
        data = _read_body(resp, max_body, end, what)
        result = (resp.status, data, resp.getheader("Location") or "", resp.getheader("Retry-After") or "")
    except (OSError, http.client.HTTPException):
        if expired.is_set() or time.monotonic() >= end:
            raise ProviderError("timeout", f"{what}: no complete answer within {deadline_s:g} s") from None
        raise
    finally:
        timer.cancel()
        conn.close()
    if expired.is_set():
        raise ProviderError("timeout", f"{what}: no complete answer within {deadline_s:g} s")
    return result


def _read_body(resp: "http.client.HTTPResponse", max_body: int, end: float, what: str) -> bytes:
    length = resp.getheader("Content-Length")
    if length and length.strip().isdigit() and int(length) > max_body:
        raise ProviderError("bad_answer", f"{what}: answer of {int(length)} bytes, more than {max_body}")
    chunks, size = [], 0
    while True:
        if time.monotonic() >= end:
            raise socket.timeout("deadline")
        chunk = resp.read1(65536) if hasattr(resp, "read1") else resp.read(65536)
        if not chunk:
            return b"".join(chunks)
        size += len(chunk)
        if size > max_body:
            raise ProviderError("bad_answer", f"{what}: answer longer than {max_body} bytes")
        chunks.append(chunk)


def _decode(status: int, data: bytes, what: str, key: str, location: str, retry_after: str) -> Any:
    """The JSON of a 2xx / 404 / 409 answer; a ``ProviderError`` for any other status or for bad JSON."""
    text = _clean(data.decode("utf-8", "replace"), key)
    if 300 <= status < 400:
        raise ProviderError(
            "redirect",
            f"{what}: redirected ({status}) to {_clean(location, key)!r}; redirects are never followed",
        )
    if status in (401, 403):
        raise ProviderError("auth", f"{what}: the API key was refused ({status}): {text}")
    if status == 429:
        wait = f" (retry after {_clean(retry_after, key, 20)} s)" if retry_after else ""
        raise ProviderError("rate_limited", f"{what}: rate limited (429){wait}")
    if status >= 500:
        raise ProviderError("server", f"{what}: provider error {status}: {text}")
    if not (200 <= status < 300 or status in (404, 409)):
        raise ProviderError("bad_answer", f"{what}: unexpected status {status}: {text}", status)
    if not data.strip():
        return None
    try:
        return json.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, ValueError):
        if status in (404, 409):
            return None
        raise ProviderError("bad_answer", f"{what}: answer is not JSON: {text}") from None


# ---- field checks ----------------------------------------------------------------------------------------------


def _bad(provider: str, field: str, value: Any, wanted: str) -> ProviderError:
    shown = _clean(repr(value), limit=60)
    return ProviderError("bad_answer", f"{provider} API: {field} must be {wanted}, not {shown}")


def field_str(obj: Dict[str, Any], name: str, provider: str, optional: bool = False) -> Optional[str]:
    """``obj[name]`` as a short string (None where ``optional`` and absent/null), else a ``ProviderError``."""
    value = obj.get(name)
    if value is None and optional:
        return None
    if not isinstance(value, str) or len(value) > 200:
        raise _bad(provider, name, value, "a string")
    return value


def field_price(obj: Dict[str, Any], name: str, provider: str, scale: float = 1.0) -> Optional[float]:
    """A price per hour: a number (or a decimal string), finite, 0 to ``MAX_PRICE``; None when absent/null."""
    value = obj.get(name)
    if value is None:
        return None
    if isinstance(value, str) and re.match(r"^\s*\d{1,9}(\.\d{1,12})?\s*$", value):
        value = float(value)
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise _bad(provider, name, value, "a number")
    price = float(value) * scale
    if not math.isfinite(price) or not 0 <= price <= MAX_PRICE:
        raise _bad(provider, name, value, f"a price from 0 to {MAX_PRICE:g} per hour")
    return price


def field_epoch(obj: Dict[str, Any], name: str, provider: str) -> Optional[float]:
    """A time as epoch seconds: a number, or an ISO 8601 string (``...Z`` allowed); None when absent/null."""
    value = obj.get(name)
    if value is None:
        return None
    if isinstance(value, str):
        text = value.strip().replace("Z", "+00:00").replace("z", "+00:00")
        # Python 3.8 reads a fraction of exactly 3 or 6 digits only: make it 6
        text = re.sub(r"\.(\d{1,9})", lambda m: "." + (m.group(1) + "00000")[:6], text, count=1)
        try:
            when = datetime.datetime.fromisoformat(text)
        except ValueError:
            raise _bad(provider, name, value, "an ISO 8601 time") from None
        if when.tzinfo is None:
            when = when.replace(tzinfo=datetime.timezone.utc)
        return when.timestamp()
    if (
        isinstance(value, bool)
        or not isinstance(value, (int, float))
        or not math.isfinite(value)
        or not 0 <= value < MAX_EPOCH
    ):
        raise _bad(provider, name, value, "a time")
    return float(value)


def field_address(obj: Dict[str, Any], name: str, provider: str) -> Optional[str]:
    """A host name or IP address (letters, digits, ``._:-``); None when absent, null or empty."""
    value = obj.get(name)
    if value is None or value == "":
        return None
    if not isinstance(value, str) or not _ADDRESS.match(value):
        raise _bad(provider, name, value, "a host name or an IP address")
    return value


def field_port(obj: Dict[str, Any], name: str, provider: str) -> Optional[int]:
    """A TCP port, 1 to 65535 (vast.ai gives ``HostPort`` as a string); None when absent/null."""
    return _whole(obj, name, provider, 1, 65535, "a port from 1 to 65535")


def field_count(obj: Dict[str, Any], name: str, provider: str) -> Optional[int]:
    """A count (GPUs, GB): 0 to 10**6; None when absent/null."""
    return _whole(obj, name, provider, 0, 10**6, "a whole number")


def _whole(obj: Dict[str, Any], name: str, provider: str, low: int, high: int, wanted: str) -> Optional[int]:
    """A whole number from ``low`` to ``high``, given as a number or a decimal string; None when absent/null."""
    value = obj.get(name)
    if value is None:
        return None
    whole_text = isinstance(value, str) and value.strip().isdigit() and len(value.strip()) <= 9
    if whole_text or (isinstance(value, float) and value.is_integer()):
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise _bad(provider, name, value, wanted)
    return value


def field_bool(obj: Dict[str, Any], name: str, provider: str) -> Optional[bool]:
    """true / false; None when absent/null."""
    value = obj.get(name)
    if value is None:
        return None
    if not isinstance(value, bool):
        raise _bad(provider, name, value, "true or false")
    return value


def _obj(value: Any, provider: str, what: str) -> Dict[str, Any]:
    if not isinstance(value, dict):
        raise _bad(provider, what, value, "a JSON object")
    return value


class Fields:
    """Reads one answer's fields, each into its typed value or, where the answer gave it unusably, None with
    the reason kept in ``unusable`` as (the field it feeds, why): whether that matters is for each action to
    say (``NEEDS``), not for the reader."""

    def __init__(self, obj: Dict[str, Any], provider: str) -> None:
        self.obj, self.provider = obj, provider
        self.unusable: List[Tuple[str, str]] = []

    def inner(self, obj: Any) -> "Fields":
        """A reader of the nested object ``obj`` (or of the field named so), noting into this one's
        ``unusable``; an absent or non-object one reads as empty."""
        value = self.obj.get(obj) if isinstance(obj, str) else obj
        nested = Fields(value if isinstance(value, dict) else {}, self.provider)
        nested.unusable = self.unusable
        return nested

    def get(self, read: Callable[..., Any], name: str, feeds: str, *args: Any) -> Any:
        """``read(obj, name, provider, *args)`` (``field_str``, ``field_price``, ``field_epoch``); None when
        that raises a ``ProviderError``, noted as unusable for ``feeds``."""
        try:
            return read(self.obj, name, self.provider, *args)
        except ProviderError as exc:
            self.unusable.append((feeds, str(exc)))
            return None


# ---- the providers ---------------------------------------------------------------------------------------------

_RUNPOD_STATES = {"RUNNING": RUNNING, "EXITED": STOPPED, "TERMINATED": TERMINATED, "CREATED": STARTING}


def _runpod_instance(data: Any, pod_id: str) -> Instance:
    pod = _obj(data, RUNPOD, "the pod")
    if pod.get("id") is not None and pod.get("id") != pod_id:
        raise _bad(RUNPOD, "id", pod.get("id"), f"the pod asked for ({pod_id})")
    got = Fields(pod, RUNPOD)
    status = got.get(field_str, "desiredStatus", "state")
    volume = got.get(field_str, "networkVolumeId", "can_stop", True)
    why = ""
    if volume:
        why = f"pod {pod_id} has a network volume ({_clean(volume, limit=40)}): RunPod can only terminate it"
    price, started = got.get(field_price, "costPerHr", "price_per_hour"), got.get(field_epoch, "lastStartedAt", "started_at")
    address = got.get(field_address, "publicIp", "endpoints")
    port = got.inner("portMappings").get(field_port, "22", "endpoints")
    gpus = got.inner("gpu").get(field_count, "count", "gpus")
    interruptible = got.get(field_bool, "interruptible", "interruptible")
    volume_gb = got.get(field_count, "volumeInGb", "stopped_per_hour")
    return Instance(
        RUNPOD, pod_id, _RUNPOD_STATES.get(status or "", OTHER), status or "?", price, started, not why, why,
        tuple(got.unusable), endpoints=(("direct", address, port),) if address and port else (),
        interruptible=interruptible, gpus=gpus,
        stopped_per_hour=None if volume_gb is None else volume_gb * RUNPOD_STOPPED_GB_MONTH / HOURS_PER_MONTH,
    )


def _vast_state(actual: Optional[str], cur: Optional[str]) -> str:
    if actual == "stopped" or cur == "stopped":
        return STOPPED  # docs: "Container is halted. Disk charges continue; no GPU charges."
    if actual in ("running", "frozen"):
        return RUNNING  # both bill the GPU
    if actual in (None, "loading", "created", "scheduling"):
        return STARTING
    return OTHER


def _vast_instance(data: Any, instance_id: str) -> Optional[Instance]:
    """The instance in a show-instance answer; None when the answer says there is none (destroyed)."""
    body = _obj(data, VASTAI, "the answer")
    inst = body.get("instances")
    if inst is None or inst == {} or inst == []:
        return None
    inst = _obj(inst, VASTAI, "instances")
    got = inst.get("id")
    if got is not None and (isinstance(got, bool) or str(got) != instance_id):
        raise _bad(VASTAI, "id", got, f"the instance asked for ({instance_id})")
    fields = Fields(inst, VASTAI)
    actual = fields.get(field_str, "actual_status", "state", True)
    cur = fields.get(field_str, "cur_state", "state", True)
    state = _vast_state(actual, cur)
    if state == STOPPED:  # either word says stopped: known even where the other one is unusable
        fields.unusable = [(f, why) for f, why in fields.unusable if f != "state"]
    elif any(f == "state" for f, _ in fields.unusable):
        state = OTHER
    price, started = fields.get(field_price, "dph_total", "price_per_hour"), fields.get(field_epoch, "start_date", "started_at")
    mapped = fields.inner("ports").obj.get("22/tcp")
    first = mapped[0] if isinstance(mapped, list) and mapped and isinstance(mapped[0], dict) else {}
    direct = (fields.get(field_address, "public_ipaddr", "endpoints"), fields.inner(first).get(field_port, "HostPort", "endpoints"))
    proxy = (fields.get(field_address, "ssh_host", "endpoints"), fields.get(field_port, "ssh_port", "endpoints"))
    endpoints = tuple((kind, a, p) for kind, (a, p) in (("direct", direct), ("proxy", proxy)) if a and p)
    interruptible, gpus = fields.get(field_bool, "is_bid", "interruptible"), fields.get(field_count, "num_gpus", "gpus")
    disk_gb = fields.get(field_price, "disk_space", "stopped_per_hour")
    gb_month = fields.get(field_price, "storage_cost", "stopped_per_hour")
    return Instance(
        VASTAI, instance_id, state, f"{actual or 'null'}/{cur or 'null'}", price, started, True, "",
        tuple(fields.unusable), endpoints=endpoints, interruptible=interruptible, gpus=gpus,
        stopped_per_hour=None if disk_gb is None or gb_month is None else disk_gb * gb_month / HOURS_PER_MONTH,
    )


def _call(
    detected: Detected, method: str, path: str, body: Optional[Dict[str, Any]], api_url: Optional[str],
    env: Optional[Dict[str, str]], deadline_s: float,
) -> Tuple[int, Any]:
    key = _key_of(detected, env)
    base = check_api_url(api_url or API_URLS[detected.provider])
    return http_json(method, base + path, key, body, deadline_s)


def _path(detected: Detected) -> str:
    quoted = urllib.parse.quote(detected.instance_id, safe="")
    return f"/pods/{quoted}" if detected.provider == RUNPOD else f"/instances/{quoted}/"


def _read(
    detected: Detected, api_url: Optional[str], env: Optional[Dict[str, str]], deadline_s: float,
) -> Optional[Instance]:
    """The instance now; None when the provider says it does not exist (404, or vast.ai's empty answer)."""
    status, data = _call(detected, "GET", _path(detected), None, api_url, env, deadline_s)
    if status in (404, 409):
        return None
    if detected.provider == RUNPOD:
        return _runpod_instance(data, detected.instance_id)
    return _vast_instance(data, detected.instance_id)


def instance(
    detected: Detected, api_url: Optional[str] = None, env: Optional[Dict[str, str]] = None,
    deadline_s: float = DEADLINE_S,
) -> Instance:
    """This host's instance as the provider reports it (state, price per hour, ...).

    ``api_url`` overrides the provider's base (``[providers.NAME] api_url``); ``env`` is for tests, as in
    ``detect``."""
    found = _read(detected, api_url, env, deadline_s)
    if found is None:
        raise ProviderError(
            "not_found", f"{detected.provider}: no instance {detected.instance_id} for this key"
        )
    return found.needed("status")


def check(
    detected: Detected, mode: Optional[str] = None, api_url: Optional[str] = None,
    env: Optional[Dict[str, str]] = None, deadline_s: float = DEADLINE_S,
) -> Instance:
    """Prove, without side effects, that a release would work: the key is accepted and the instance answers
    (and, with ``mode``, that the provider can do that mode for it). The instance, or a ``ProviderError``."""
    found = instance(detected, api_url, env, deadline_s).needed("check")
    if mode is not None:
        _check_mode(found, mode)
    return found


def _check_mode(found: Instance, mode: str) -> None:
    if mode not in MODES:
        raise ProviderError("config", f"release mode must be one of {', '.join(MODES)}, not {mode!r}")
    if mode == "stop" and not found.can_stop:
        raise ProviderError("unsupported", found.why_no_stop + ' (set release_mode = "terminate")')


def release(
    detected: Detected, mode: str, api_url: Optional[str] = None, env: Optional[Dict[str, str]] = None,
    deadline_s: float = DEADLINE_S,
) -> None:
    """Ask the provider to stop (``mode="stop"``) or terminate this instance. The provider accepting the request
    is not the bill stopping: follow with ``confirm``. Raises ``ProviderError`` (``unsupported`` for a mode the
    provider cannot do for this instance, saying why)."""
    if mode not in MODES:
        raise ProviderError("config", f"release mode must be one of {', '.join(MODES)}, not {mode!r}")
    if detected.provider == RUNPOD and mode == "stop":
        _check_mode(instance(detected, api_url, env, deadline_s).needed("release"), mode)
    path = _path(detected)
    if detected.provider == RUNPOD:
        method, path, body = ("POST", path + "/stop", None) if mode == "stop" else ("DELETE", path, None)
    else:
        method, body = ("PUT", {"state": "stopped"}) if mode == "stop" else ("DELETE", None)
    status, data = _call(detected, method, path, body, api_url, env, deadline_s)
    if status == 404:
        raise ProviderError("not_found", f"{detected.provider}: no instance {detected.instance_id} to {mode}")
    if status == 409:
        raise ProviderError("bad_answer", f"{detected.provider}: {mode} refused (409 conflict)")
    if detected.provider == VASTAI and isinstance(data, dict) and data.get("success") is False:
        msg = data.get("msg") or data.get("error") or ""
        raise ProviderError("bad_answer", f"vastai: {mode} refused: {_clean(str(msg))}")


def start(
    detected: Detected, api_url: Optional[str] = None, env: Optional[Dict[str, str]] = None,
    deadline_s: float = DEADLINE_S,
) -> None:
    """Ask the provider to start this stopped instance (RunPod ``POST /pods/{id}/start``, vast.ai ``PUT
    /instances/{id}/`` with ``{"state": "running"}``); called only from the user's machine, for ``gputui
    start``. Accepting is not running: read it back. A refusal is a ``ProviderError`` with the provider's words."""
    path = _path(detected)
    if detected.provider == RUNPOD:
        method, path, body = "POST", path + "/start", None  # type: Tuple[str, str, Optional[Dict[str, Any]]]
    else:
        method, body = "PUT", {"state": "running"}
    try:
        status, data = _call(detected, method, path, body, api_url, env, deadline_s)
    except ProviderError as exc:
        if exc.status is None or not 400 <= exc.status < 500:
            raise
        raise ProviderError("refused", f"{detected.provider} refused to start it: {exc}") from None
    if status == 404:
        raise ProviderError("not_found", f"{detected.provider}: no instance {detected.instance_id} to start")
    words = ""
    if isinstance(data, dict):
        words = data.get("msg") or data.get("error") or data.get("message") or ""
    if status == 409 or (detected.provider == VASTAI and isinstance(data, dict) and data.get("success") is False):
        raise ProviderError("refused", f"{detected.provider} refused to start it: {_clean(str(words)) or status}")


def reached(found: Optional[Instance], mode: str) -> bool:
    """Whether the bill for compute has stopped as ``mode`` asked: stop is satisfied by stopped or terminated,
    terminate only by terminated (or by the instance being gone)."""
    if found is None:
        return True
    return found.state == TERMINATED or (mode == "stop" and found.state == STOPPED)


def confirm(
    detected: Detected, mode: str, timeout_s: float = 300.0, interval_s: float = 5.0,
    api_url: Optional[str] = None, env: Optional[Dict[str, str]] = None,
    deadline_s: float = DEADLINE_S, sleep: Callable[[float], None] = time.sleep,
    clock: Callable[[], float] = time.monotonic,
) -> Confirmed:
    """Read the instance back until the provider says stopped / terminated, for at most ``timeout_s``.

    Transient errors (timeouts, 429, 5xx) are retried within the bound; a refused key or a broken answer ends
    it at once. Past the bound: ``ProviderError("unconfirmed")`` naming the last state seen. Note a stop or
    terminate ends the container this runs in: a confirm from the host may die with it (callers record the
    request first)."""
    if mode not in MODES:
        raise ProviderError("config", f"release mode must be one of {', '.join(MODES)}, not {mode!r}")
    end, polls, last = clock() + timeout_s, 0, "no answer"
    while True:
        polls += 1
        try:
            found = _read(detected, api_url, env, min(deadline_s, max(1.0, end - clock())))
            if found is not None:
                found.needed("confirm")
        except ProviderError as exc:
            if not exc.retryable:
                raise
            last = str(exc)
        else:
            if reached(found, mode):
                how = "the provider no longer lists it" if found is None else found.provider_state
                return Confirmed(
                    TERMINATED if found is None else found.state, polls, f"{detected.provider}: {how}"
                )
            last = f"{found.state} ({found.provider_state})" if found else last
        if clock() + interval_s > end:
            raise ProviderError(
                "unconfirmed",
                f"{detected.provider}: instance {detected.instance_id} not {_DONE[mode]} after {timeout_s:g} s "
                f"({polls} reads); last: {last}",
            )
        sleep(interval_s)


def detected_from(record: Any) -> Optional[Detected]:
    """A ``Detected`` from its ``describe`` record (as the watchdog's config keeps it); None when malformed."""
    if not isinstance(record, dict) or record.get("provider") not in VARIABLES:
        return None
    fields = [record.get(k) for k in ("instance_id", "source")]
    if not all(isinstance(v, str) and v for v in fields):
        return None
    return Detected(record["provider"], fields[0], fields[1])


def mode_for(found: Instance, mode: Optional[str]) -> str:
    """The release mode to use: the one set, else stop where the provider can stop this instance, else
    terminate (what ``release_mode`` unset means)."""
    return mode if mode else ("stop" if found.can_stop else "terminate")


def wanted(provider_setting: Any) -> bool:
    """Whether the host's ``provider`` setting lets the agent release through a provider it detects."""
    return provider_setting in (None, "auto", RUNPOD, VASTAI)


def detect_for(provider_setting: Any) -> Detected:
    """``detect()``, kept only when the host's ``provider`` setting allows it (``auto`` or that provider)."""
    if not wanted(provider_setting):
        return Detected(NONE, note="provider = %r in the config" % (provider_setting,))
    found = detect()
    if found.provider != NONE and provider_setting not in (None, "auto", found.provider):
        return Detected(NONE, note="the config says provider %r, this host is %s" % (provider_setting, found.provider))
    return found


def describe(detected: Detected) -> Dict[str, str]:
    """What may be shown or sent about a detection (the provider, the id, the source): never the key."""
    return {"provider": detected.provider, "instance_id": detected.instance_id, "source": detected.source,
            "note": detected.note}


__all__ = [
    "API_URLS", "MODES", "Confirmed", "Detected", "Instance", "ProviderError", "check", "check_api_url",
    "confirm", "describe", "detect", "detect_for", "detected_from", "http_json", "mode_for", "wanted", "instance", "parse_env_file", "parse_environ", "reached",
    "release", "start",
]
