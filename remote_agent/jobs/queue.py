"""The GPU-aware queue: jobs that wait on the host for their GPUs, started by the detached watchdog process.

A queued job gets its job dir at once (its id, job.json with a ``queue`` request, env.json) but no runner. The
request: ``gpus`` (None: every GPU, exclusively; ``"0,1"``: those GPUs; ``"none"``: no GPU) or ``gpu_count``
(any N free GPUs), ``after`` and ``after_ok`` (job ids that must end first; ``after_ok`` ones must also succeed)
and ``idle_util_percent``.

``queue.json`` in the state dir keeps the order (ids) and what each job waits for, as the scheduler last saw it;
the job dirs stay the truth of what is queued, so a lost or damaged order file loses no job (they fall back to
submission order). Every change holds ``queue.lock`` (submit, move, remove, pick), and a pick is one atomic
write of job.json (``dequeued_at`` and the GPUs) before the runner is launched: a crash in between leaves a job
that is picked but has no runner, no status and no tmux session, which the next pass launches (tmux refuses a
second session of the same name, so it never runs twice).

A GPU is free for the queue when no running gputui job holds it, no process outside gputui uses it, and its
utilisation is below the job's idle threshold. Jobs are taken in order; a job that must wait keeps the GPUs it
named (or, asking for a count or every GPU, all the GPUs still free) from the jobs behind it, so a big job is
never starved by small ones. A job waiting only for other jobs to end keeps nothing.
"""

import contextlib
import os
import shutil
import time
from typing import Any, Callable, Dict, List, Optional, Tuple

from .. import protocol as P
from ..fsutil import read_json, write_json
from ..host.container import grant_of, holders
from .secrets import end_job
from .store import _GPU_SPEC, QUEUE_LOCK, JobError, JobStore, running_jobs

QUEUE, LOCK = "queue.json", QUEUE_LOCK
MAX_QUEUED = 1000  # jobs waiting at once; a submission beyond it is refused
MAX_DEPS = P.MAX_QUEUE_DEPS  # job ids one job may wait for
MAX_REASON = 300
MAX_START_ATTEMPTS = 3  # launches of a picked job whose runner never came up, before it is failed
PASS_S = 2.0  # the scheduler's pass interval while jobs wait
#: Free space the state dir's disk needs for the queue to start a job (its runner writes its start, a reserve and
#: its log there): below it the queue waits, so a full disk burns no start attempt.
MIN_FREE_BYTES = 1024 * 1024


def parse_request(queue: Any) -> Dict[str, Any]:
    """The ``queue`` of a jobs.start request, checked; ValueError says what is wrong."""
    if not isinstance(queue, dict):
        raise ValueError("queue must be an object")
    gpus, count = queue.get("gpus"), queue.get("gpu_count")
    if gpus == "all":
        gpus = None
    if gpus is not None and not (isinstance(gpus, str) and len(gpus) <= 200 and _GPU_SPEC.match(gpus)):
        raise ValueError("queue.gpus must be none or a comma list of GPUs like 0,1, not %r" % str(gpus)[:60])
    if count is not None:
        if gpus is not None:
            raise ValueError("queue: give gpus or gpu_count, not both")
        count = P.int_arg(queue, "gpu_count", 1, 1, 1024)
    deps = {}
    for key in ("after", "after_ok"):
        ids = queue.get(key) or []
        if not isinstance(ids, list) or len(ids) > MAX_DEPS or not all(str(i).isdigit() for i in ids):
            raise ValueError("queue.%s must be a list of at most %d job ids" % (key, MAX_DEPS))
        deps[key] = [str(int(i)) for i in ids]
    util = P.number_arg(queue, "idle_util_percent", 5.0, 0.0, 100.0)
    return {"gpus": gpus, "gpu_count": count, "after": deps["after"], "after_ok": deps["after_ok"],
            "idle_util_percent": util}


def never_fits(request: Dict[str, Any], gpus: List[Dict[str, Any]]) -> Optional[str]:
    """Why a checked request can never start on a host with these GPUs (its facts), or None. Such a job would
    wait forever, keeping GPUs from the jobs behind it and the host from autostop."""
    has = "%d GPU%s" % (len(gpus), "" if len(gpus) == 1 else "s")
    count = request.get("gpu_count")
    if count is not None and count > len(gpus):
        return "queue: %d GPUs asked for, this host has %s: the job would never start" % (count, has)
    spec = request.get("gpus")
    if spec is not None and spec != "none":
        missing = [i for i in spec.split(",") if not i.startswith("MIG-") and not any(_named(g, i) for g in gpus)]
        if missing:
            return "queue: no GPU %s on this host (it has %s): the job would never start" % (
                ", ".join(missing)[:200], has)
    return None


def _damaged(job: Dict[str, Any]) -> Optional[str]:
    """Why a queued job's stored request cannot be scheduled (edited by hand, another version), or None: such a
    job fails alone instead of stopping every pass (and the watchdog's autostop with it)."""
    try:
        parse_request(job.get("queue"))
    except (TypeError, ValueError) as exc:
        return _clip("never started: its queue request cannot be read (%s)" % exc)
    return None


def _clip(text: str) -> str:
    return text if len(text) <= MAX_REASON else text[: MAX_REASON - 3] + "..."


# --- deciding ---------------------------------------------------------------------------------------------------
def gpu_blockers(
    sample: Dict[str, Any], grants: List[Dict[str, Any]], util_percent: float
) -> Dict[int, List[str]]:
    """Per GPU index of ``sample``: why the queue may not use it now (empty: free).

    ``grants``: the running jobs and what they hold (``id``, ``gpus``: their CUDA_VISIBLE_DEVICES, None: all).
    """
    out: Dict[int, List[str]] = {}
    for gpu in sample.get("gpus") or []:
        why = []
        held = holders(gpu, grants)
        why += ["held by job %s" % j["id"] for j in held]
        for proc in gpu.get("processes") or []:
            if proc.get("job") or (proc.get("hidden") and held):
                continue  # a gputui job's own (or, from another PID namespace, most likely its holder's)
            name = proc.get("name")
            why.append("used by pid %s%s" % (proc.get("pid"), " (%s)" % name if name else ""))
        util = gpu.get("util_percent")
        if util is not None and util >= util_percent and not held:
            why.append("at %.0f%% utilisation" % util)
        if gpu.get("state") == P.GPU_LOST:  # the driver cannot reach it: a job given it would only fail
            why.append("lost (%s)" % _clip(str(gpu.get("error") or "no reading")))
        out[int(gpu.get("index"))] = why
    return out


def _named(gpu: Dict[str, Any], item: str) -> bool:
    uuid = gpu.get("uuid") or ""
    return item == str(gpu.get("index")) or (len(item) > 4 and uuid.startswith(item))


def _wants(request: Dict[str, Any], sample_gpus: List[Dict[str, Any]]) -> Tuple[Optional[int], List[int], List[str]]:
    """(count or None, indices named, items naming no GPU) of a request."""
    gpus = request.get("gpus")
    if request.get("gpu_count") is not None:
        return int(request["gpu_count"]), [], []
    if gpus == "none":
        return 0, [], []
    if gpus is None:
        return None, [int(g["index"]) for g in sample_gpus], []
    named, missing = [], []
    for item in gpus.split(","):
        hit = [int(g["index"]) for g in sample_gpus if _named(g, item)]
        named += hit[:1]
        missing += [] if hit else [item]
    return None, named, missing


def _deps(job: Dict[str, Any], by_id: Dict[str, Dict[str, Any]]) -> Tuple[Optional[str], Optional[str]]:
    """(why it must wait, why it can never start) for the jobs ``job`` waits for: every dependency is checked
    for a reason it can never start before any reason to wait is given."""
    request = job["queue"]
    waits: List[str] = []
    for key in ("after_ok", "after"):
        for dep in request.get(key) or []:
            other = by_id.get(dep)
            if other is None:
                return None, "job %s it waits for (--%s) does not exist" % (dep, key.replace("_", "-"))
            state = other.get("state")
            if state in (P.JOB_QUEUED, P.JOB_RUNNING):
                waits.append("after job %s (%s)" % (dep, state))
            elif key == "after_ok" and state != P.JOB_SUCCEEDED:
                code = other.get("exit_code")
                how = "%s%s" % (state, " (exit %s)" % code if code is not None else "")
                return None, "never started: job %s it waits for (--after-ok) ended %s" % (dep, how)
    return (waits[0] if waits else None), None


def never_starts(queued: List[Dict[str, Any]], by_id: Dict[str, Dict[str, Any]]) -> Dict[str, str]:
    """The queued jobs (of the host's queue, not yet picked) that can never start, each with why: a request that
    cannot be read, a job waited for that does not exist or (``--after-ok``) did not succeed, a loop of jobs
    waiting on each other, or an ``--after-ok`` job that can itself never start. Such a job is failed by the
    next pass; until then it is no activity (it must not keep the host from autostop)."""
    waiting = [j for j in queued if host_queued(j) and j.get("dequeued_at") is None]
    out = {str(j["id"]): why for j in waiting for why in [_damaged(j)] if why}
    readable = [j for j in waiting if str(j["id"]) not in out]
    for job in readable:
        never = _deps(job, by_id)[1]
        if never:
            out[str(job["id"])] = never
    out.update({jid: why for jid, why in cycles(readable).items() if jid not in out})
    waiters: Dict[str, List[str]] = {}  # who waits (--after-ok) on each job
    for job in readable:
        for dep in job["queue"].get("after_ok") or []:
            waiters.setdefault(str(dep), []).append(str(job["id"]))
    todo = list(out)
    for doomed in todo:  # a job that must succeed first but never starts: its waiters never start either
        for jid in waiters.get(doomed, []):
            if jid not in out:
                out[jid] = "never started: job %s it waits for (--after-ok) can never start" % doomed
                todo.append(jid)
    return out


def cycles(queued: List[Dict[str, Any]]) -> Dict[str, str]:
    """Queued jobs (not yet picked) that wait on themselves, each with the loop it is caught in: such a job can
    never start. One strongly connected components pass over the ``after``/``after_ok`` links between them."""
    waiting = {str(j["id"]): j for j in queued if j.get("dequeued_at") is None}
    links: Dict[str, List[str]] = {}
    for jid, job in waiting.items():
        request = job.get("queue") if isinstance(job.get("queue"), dict) else {}
        deps = [str(d) for key in ("after", "after_ok") for d in request.get(key) or []]
        links[jid] = sorted({d for d in deps if d in waiting}, key=lambda d: (len(d), d))
    out: Dict[str, str] = {}
    for part in _components(links):
        if len(part) == 1 and part[0] not in links[part[0]]:
            continue  # a job waiting on no loop
        inside = set(part)
        root = part[0]
        inward: Dict[str, List[str]] = {j: [] for j in part}  # who waits on each job of the loop
        for j in part:
            for d in links[j]:
                if d in inside:
                    inward[d].append(j)
        forward = _paths(root, {j: [d for d in links[j] if d in inside] for j in part})
        back = _paths(root, inward)
        for jid in part:
            # the root: to a job that waits on it, and back; any other job: to the root, and back
            walk = forward[inward[root][0]] + [root] if jid == root else back[jid][::-1] + forward[jid][1:]
            shown = walk if len(walk) <= 12 else walk[:11] + ["...", walk[-1]]
            out[jid] = _clip("never started: it waits on itself through %s" % " -> ".join(shown))
    return out


def _components(links: Dict[str, List[str]]) -> List[List[str]]:
    """Strongly connected components of a graph (Tarjan's, iterative: a long chain must not hit the recursion
    limit)."""
    index: Dict[str, int] = {}
    low: Dict[str, int] = {}
    stack: List[str] = []
    on_stack: set = set()
    out: List[List[str]] = []
    for start in links:
        if start in index:
            continue
        work = [(start, iter(links[start]))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, deps = work[-1]
            dep = next(deps, None)
            if dep is not None:
                if dep not in index:
                    index[dep] = low[dep] = len(index)
                    stack.append(dep)
                    on_stack.add(dep)
                    work.append((dep, iter(links[dep])))
                elif dep in on_stack:
                    low[node] = min(low[node], index[dep])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                part = []
                while True:
                    top = stack.pop()
                    on_stack.discard(top)
                    part.append(top)
                    if top == node:
                        break
                out.append(sorted(part, key=lambda j: (len(j), j)))
    return out


def _paths(root: str, links: Dict[str, List[str]]) -> Dict[str, List[str]]:
    """A shortest path from ``root`` to every node it reaches (breadth first)."""
    paths = {root: [root]}
    todo = [root]
    for node in todo:
        for dep in links[node]:
            if dep not in paths:
                paths[dep] = paths[node] + [dep]
                todo.append(dep)
    return paths


def plan(
    queued: List[Dict[str, Any]], jobs: List[Dict[str, Any]], sample: Dict[str, Any],
    grants: List[Dict[str, Any]],
) -> Dict[str, Any]:
    """What to do with the queued jobs (in queue order) now: ``{"start": [(id, gpus or None)], "wait": {id:
    reason}, "fail": {id: reason}}``. ``gpus`` of a start: the CUDA_VISIBLE_DEVICES to give (None: all)."""
    by_id = {str(j.get("id")): j for j in jobs}
    sample_gpus = sorted(sample.get("gpus") or [], key=lambda g: int(g.get("index")))
    reserved: set = set()
    grants = list(grants)
    start: List[Tuple[str, Optional[str]]] = []
    wait: Dict[str, str] = {}
    fail: Dict[str, str] = {}
    doomed = never_starts(queued, by_id)
    for job in queued:
        jid, request = str(job["id"]), job["queue"]
        waits_for, never = _deps(job, by_id)[0], doomed.get(jid)
        if never:
            fail[jid] = never
            continue
        if waits_for:
            wait[jid] = waits_for
            continue
        blockers = gpu_blockers(sample, grants, float(request.get("idle_util_percent", 5.0)))
        count, named, missing = _wants(request, sample_gpus)
        free = [i for i in sorted(blockers) if not blockers[i] and i not in reserved]
        why: List[str] = []
        if missing:
            why.append("no GPU %s on this host" % ", ".join(missing))
        if count is not None:
            if count and not sample_gpus:
                why.append("no GPU readings (%s)" % (sample.get("gpu_error") or "no GPU found"))
            elif len(free) < count:
                why.append("needs %d free GPU%s, %d free" % (count, "s" if count > 1 else "", len(free)))
                why += ["GPU %d %s" % (i, "; ".join(b)) for i, b in sorted(blockers.items()) if b]
            take = free[:count]
        else:
            take = named
            for i in named:
                if i in reserved:
                    why.append("GPU %d kept for an earlier job of the queue" % i)
                elif blockers[i]:
                    why.append("GPU %d %s" % (i, "; ".join(blockers[i])))
            if request.get("gpus") is None:
                exclusive = [g["id"] for g in grants if g.get("gpus") is None and not sample_gpus]
                why += ["job %s running (this job asks for the whole host)" % j for j in exclusive]
        if why:
            wait[jid] = _clip("; ".join(why))
            reserved |= set(named) if named and request.get("gpus") is not None else set(free)
            continue
        spec: Optional[str] = ",".join(str(i) for i in take)
        if count == 0:
            spec = "none"
        elif count is None and request.get("gpus") is None:
            spec = None  # the whole host: CUDA_VISIBLE_DEVICES stays unset
        start.append((jid, spec))
        grants.append({"id": jid, "gpus": spec})
        reserved |= set(take)
    return {"start": start, "wait": wait, "fail": fail}


def disk_full(path: str) -> Optional[str]:
    """Why the disk of ``path`` has no room to start a job (under ``MIN_FREE_BYTES``, or no inode), or None."""
    try:
        st = os.statvfs(path)
    except OSError:
        return None  # unknown: the start itself will tell
    free = (st.f_bfree if os.geteuid() == 0 else st.f_bavail) * st.f_frsize
    if free >= MIN_FREE_BYTES and not (st.f_files and st.f_favail == 0):
        return None
    return "the state dir's disk is full (%d KiB free): jobs start again from %d KiB" % (
        free // 1024, MIN_FREE_BYTES // 1024)


# --- the queue on disk -------------------------------------------------------------------------------------------

def host_queued(record: Dict[str, Any]) -> bool:
    """Whether a job waits in this host's queue (a queued Slurm job waits in Slurm's)."""
    return record.get("state") == P.JOB_QUEUED and record.get("scheduler") != "slurm"

class JobQueue:
    """Submitting, ordering, removing and starting queued jobs of one state dir."""

    def __init__(self, store: JobStore, log: Callable[[str], None] = lambda m: None) -> None:
        self.store = store
        self.path = os.path.join(store.state_dir, QUEUE)
        self.log = log

    def locked(self) -> "contextlib.AbstractContextManager[None]":
        return self.store.queue_locked()

    def state(self) -> Dict[str, Any]:
        saved = read_json(self.path)
        return saved if isinstance(saved, dict) else {}

    def _write(self, **changes: Any) -> None:
        write_json(self.path, dict(self.state(), **changes))

    def queued(self, jobs: Optional[List[Dict[str, Any]]] = None) -> List[Dict[str, Any]]:
        """The queued jobs' records, in queue order: the saved order first, then any others by id."""
        jobs = self.store.list() if jobs is None else jobs
        waiting = {str(j["id"]): j for j in jobs if host_queued(j)}
        order = [str(i) for i in self.state().get("order") or [] if str(i) in waiting]
        rest = sorted((i for i in waiting if i not in set(order)), key=int)
        return [waiting[i] for i in order + rest]

    def submit(
        self, request: Dict[str, Any], argv: Any, cwd: Any, env: Any, name: Any, extra: Dict[str, Any],
        boot: Optional[str], secrets: Any = None,
    ) -> str:
        """Queue a job; its id. The jobs it waits for must exist; ``secrets`` wait with it (JobStore.create)."""
        with self.locked():
            jobs = self.store.list()
            ids = {str(j["id"]) for j in jobs}
            unknown = [d for d in request["after"] + request["after_ok"] if d not in ids]
            if unknown:
                raise JobError("no job %s on this host to wait for" % ", ".join(unknown), P.E_BAD_ARGS)
            queued = self.queued(jobs)
            if len(queued) >= MAX_QUEUED:
                raise JobError("the queue is full (%d jobs wait)" % len(queued), P.E_FAILED)
            job_id = self.store.create(argv, cwd, env, name, request["gpus"],
                                       dict(extra, queue=dict(request, queued_at=time.time())), None, secrets)
            self._refuse_a_loop(job_id, queued)
            order = [str(j["id"]) for j in queued] + [job_id]
            self._write(order=order, boot_id=self.state().get("boot_id") or boot, nvidia_smi=self.store.nvidia_smi)
        self.log("queue: job %s queued at position %d" % (job_id, len(order)))
        return job_id

    def _refuse_a_loop(self, job_id: str, queued: List[Dict[str, Any]]) -> None:
        """Take a just created queued job back when it closes a loop of jobs waiting on each other (a job it waits
        for waits on its id: that job's own dependency was deleted and its id given to this one)."""
        looped = cycles(queued + [self.store.describe(job_id)]).get(job_id)
        if looped:
            shutil.rmtree(self.store.job_dir(job_id))  # the dir this call created a moment ago, nothing else
            raise JobError("not queued: the job would wait on itself through %s"
                           % looped.split(" through ", 1)[1], P.E_BAD_ARGS)

    def move(self, job_id: str, to: int) -> List[str]:
        """Put a queued job at position ``to`` (1 = next); the new order."""
        with self.locked():
            order = [str(j["id"]) for j in self.queued()]
            if job_id not in order:
                raise JobError("job %s is not queued on this host" % job_id[:100], P.E_NOT_FOUND)
            order.remove(job_id)
            order.insert(max(0, min(len(order), to - 1)), job_id)
            self._write(order=order)
        self.log("queue: job %s moved to position %d" % (job_id, order.index(job_id) + 1))
        return order

    def remove(self, job_id: str, why: str) -> Optional[Dict[str, Any]]:
        """End a queued job before it starts (state killed); None when it is not queued any more."""
        with self.locked():
            job_dir = self.store.job_dir(job_id)
            record = self.store.describe(job_id)
            if not host_queued(record):  # (a job picked before a crash but never started still is)
                return None
            now = time.time()
            write_json(os.path.join(job_dir, "kill.json"), {"asked_at": now, "grace_s": 0.0})
            end_job(job_dir, {"exit_code": None, "error": why, "ended_at": now})
        self.log("queue: job %s removed (%s)" % (job_id, why))
        return self.store.describe(job_id)

    def marks(
        self, records: List[Dict[str, Any]], jobs: Optional[List[Dict[str, Any]]] = None
    ) -> List[Dict[str, Any]]:
        """The records, with ``queue_position`` and ``queue_reason`` added to each queued job's (``jobs``: every
        job, when the caller has them: else they are listed)."""
        if not any(r.get("state") == P.JOB_QUEUED for r in records):
            return records
        positions = {str(j["id"]): n for n, j in enumerate(self.queued(jobs), 1)}
        waiting = self.state().get("waiting") or {}
        out = []
        for record in records:
            jid = str(record.get("id"))
            if record.get("state") == P.JOB_QUEUED and jid in positions:
                reason = waiting.get(jid) if isinstance(waiting, dict) else None
                record = dict(record, queue_position=positions[jid],
                              queue_reason=str(reason or "waiting for the scheduler's next pass"))
            out.append(record)
        return out

    # --- the scheduler (in the watchdog process) ------------------------------------------------------------
    def run_pass(self, sample: Optional[Dict[str, Any]], jobs: List[Dict[str, Any]], boot: Optional[str]) -> int:
        """One scheduling pass; how many jobs the scheduler must stay for: those still waiting, and those picked
        whose start is not on record yet (launched now or before). ``sample``: None when the GPUs could not be
        read."""
        with self.locked():
            queued = self.queued(jobs)
            saved = self.state()
            resumed = bool(queued) and saved.get("boot_id") not in (None, boot)
            if resumed:
                saved = dict(saved, resumed_at=time.time())
            relaunch = [j for j in queued if j.get("dequeued_at") is not None]
            fresh = [j for j in queued if j.get("dequeued_at") is None]
            damaged = {str(j["id"]): _damaged(j) for j in fresh}
            damaged = {jid: why for jid, why in damaged.items() if why is not None}
            fresh = [j for j in fresh if str(j["id"]) not in damaged]
            full = disk_full(self.store.state_dir)
            launched = sum(self._relaunch(job) for job in (relaunch if full is None else []))
            if sample is None or full is not None:
                decided: Dict[str, Any] = {"start": [], "fail": {}, "wait": {
                    str(j["id"]): full or "GPU reading failed" for j in fresh}}
            else:
                grants = self._grants(jobs) + [{"id": j["id"], "gpus": j.get("gpus")} for j in relaunch]
                decided = plan(fresh, jobs, sample, grants)
            decided["fail"].update(damaged)
            for jid, why in decided["fail"].items():
                self._fail(jid, why)
            launched += sum(self._start(jid, gpus) for jid, gpus in decided["start"])
            gone = set(decided["fail"]) | {jid for jid, _ in decided["start"]} | {str(j["id"]) for j in relaunch}
            listed = {str(j.get("id")) for j in jobs}
            order = [str(j["id"]) for j in queued if str(j["id"]) not in gone]
            order += [i for i in map(str, saved.get("order") or []) if i not in listed]  # queued since the listing
            waiting = {jid: why for jid, why in decided["wait"].items() if jid in order}
            if not order:
                saved.pop("resumed_at", None)  # the resumed queue is done
            write_json(self.path, dict(saved, order=order, waiting=waiting, boot_id=boot, t=time.time()))
        if resumed:  # said once it is recorded: whoever reads the line finds resumed_at in queue.list
            self.log("queue resumed after a reboot: %d job%s waiting" % (len(queued), "s" if len(queued) > 1 else ""))
        return len(order) + launched + self.coming_up(jobs)

    def coming_up(self, jobs: List[Dict[str, Any]]) -> int:
        """How many picked jobs have no start on record yet (no pid.json, no status.json): each is either
        coming up or, its runner gone, launched again by a later pass, so the scheduler must stay for them."""
        count = 0
        for job in jobs:
            if job.get("state") == P.JOB_RUNNING and isinstance(job.get("queue"), dict) and job.get("dequeued_at"):
                job_dir = os.path.join(self.store.jobs_dir, str(job.get("id")))
                count += not any(os.path.exists(os.path.join(job_dir, f)) for f in ("pid.json", "status.json"))
        return count

    def _grants(self, jobs: List[Dict[str, Any]]) -> List[Dict[str, Any]]:
        """What each running job holds: its CUDA_VISIBLE_DEVICES as it runs (None: every GPU)."""
        live = {j["id"]: j for j in running_jobs(self.store.jobs_dir)}
        out = []
        for job in jobs:
            if job.get("state") == P.JOB_RUNNING:
                known = live.get(str(job["id"]))
                out.append({"id": str(job["id"]), "gpus": known["gpus"] if known else grant_of(job)})
        return out

    def _still_queued(self, job_id: str) -> bool:
        """Not killed, removed nor picked since the pass listed the jobs (the caller holds the lock)."""
        job_dir = self.store.job_dir(job_id)
        record = read_json(os.path.join(job_dir, "job.json"))
        ended = any(os.path.exists(os.path.join(job_dir, f)) for f in ("status.json", "kill.json"))
        return not ended and not (
            isinstance(record, dict) and record.get("dequeued_at") is not None
        )

    def _fail(self, job_id: str, why: str, picked: bool = False) -> None:
        """End a queued job that never started (``picked``: one picked before, whose runner never came up)."""
        if not picked and not self._still_queued(job_id):
            return
        end_job(self.store.job_dir(job_id), {"exit_code": None, "error": why, "ended_at": time.time()})
        self.log("queue: job %s %s" % (job_id, why))

    def _start(self, job_id: str, gpus: Optional[str]) -> bool:
        """Pick a job (one atomic job.json write: its GPUs and ``dequeued_at``), then launch it; True when it was."""
        if not self._still_queued(job_id):
            return False
        job_dir = self.store.job_dir(job_id)
        record = read_json(os.path.join(job_dir, "job.json"))
        env = read_json(os.path.join(job_dir, "env.json"))
        if not isinstance(record, dict) or not isinstance(env, dict):
            self._fail(job_id, "not started: its job files cannot be read")
            return False
        user_env = record.get("env") if isinstance(record.get("env"), dict) else {}
        if gpus is not None and "CUDA_VISIBLE_DEVICES" not in user_env:
            env["CUDA_VISIBLE_DEVICES"] = "" if gpus == "none" else gpus
        write_json(os.path.join(job_dir, "env.json"), env)
        waited = time.time() - float((record.get("queue") or {}).get("queued_at") or time.time())
        record.update(gpus=gpus, dequeued_at=time.time(), start_attempts=1)
        write_json(os.path.join(job_dir, "job.json"), record)
        where = "the whole host" if gpus is None else "no GPU" if gpus == "none" else "GPU " + gpus
        self.log("queue: starting job %s on %s after %.1f min in the queue" % (job_id, where, waited / 60.0))
        self._launch(job_id)
        return True

    def _relaunch(self, job: Dict[str, Any]) -> bool:
        """A job picked before a crash whose runner never came up: launch it again (a bounded number of times);
        True when it was."""
        jid = str(job["id"])
        job_dir = self.store.job_dir(jid)
        record = read_json(os.path.join(job_dir, "job.json"))
        if not isinstance(record, dict) or self.store.describe(jid).get("state") != P.JOB_QUEUED:
            return False  # it came up (or ended) since the pass listed the jobs
        if os.path.exists(os.path.join(job_dir, "kill.json")):  # killed before its runner came up: it stays dead
            self._fail(jid, "killed before it started", picked=True)
            return False
        attempts = int(record.get("start_attempts") or 0)
        if attempts >= MAX_START_ATTEMPTS:
            self._fail(jid, "not started: its runner did not come up in %d attempts" % attempts, picked=True)
            return False
        record.update(dequeued_at=time.time(), start_attempts=attempts + 1)
        write_json(os.path.join(job_dir, "job.json"), record)
        self.log("queue: job %s was picked but never started (a crash?): launching it again" % jid)
        self._launch(jid)
        return True

    def _launch(self, job_id: str) -> None:
        try:
            self.store.launch(job_id)
        except JobError as exc:
            self.log("queue: job %s could not start: %s" % (job_id, exc))
