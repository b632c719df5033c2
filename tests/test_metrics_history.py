"""The metric history behind the sparklines: bounded, compact (nothing per sample for the garbage collector to
walk) and showing the same values as the list of samples it replaced."""

from __future__ import annotations

import gc
import random

from gputui.core.session import model as M
from gputui.core.session.metrics_history import GpuSeries, MetricsHistory, MetricsRing
from gputui.ui import fmt
from gputui.ui.palette import Palette
from gputui.ui.widgets.host import HISTORY_WINDOW, gpu_card, gpu_series


def samples(n: int, gpus: int = 8, seed: int = 3) -> list[M.MetricsSample]:
    """Wandering readings with the awkward cases: unknown values, a GPU missing from some samples, no total."""
    rng, out = random.Random(seed), []
    for i in range(n):
        gs = []
        for k in range(gpus):
            if k == 3 and i % 7 == 0:
                continue  # GPU 3 drops out of some samples
            util = (
                None
                if (k == 2 and i % 5 == 0)
                else rng.choice([rng.uniform(0, 100), float(rng.randint(0, 100))])
            )
            total = 0 if (k == 1 and i % 11 == 0) else 81_559
            gs.append(M.GpuSample(index=k, util_percent=util, mem_used_mib=rng.uniform(0, 81_559),
                                  mem_total_mib=total, temp_c=None if i % 13 == 0 else 30 + rng.random() * 60))
        out.append(M.MetricsSample(seq=i, t=1000.0 + i, host=M.HostStats(), gpus=tuple(gs)))
    return out


def old_gpu_series(history: list[M.MetricsSample], window: int) -> dict[int, GpuSeries]:
    """What the app computed from its tuple of samples before the history became arrays."""
    out: dict[int, GpuSeries] = {}
    for sample in history[-window:]:
        for g in sample.gpus:
            util, mem, temp = out.setdefault(g.index, GpuSeries([], [], []))
            util.append(g.util_percent)
            mem.append(fmt.ratio(g.mem_used_mib, g.mem_total_mib))
            temp.append(g.temp_c)
    return out


def test_sparklines_and_hints_show_the_same_values_as_the_samples() -> None:
    kept = samples(700)[-600:]
    history = MetricsHistory.of(samples(700), capacity=600)
    assert len(history) == 600 and history.seqs() == [s.seq for s in kept]
    assert history.times() == [s.t for s in kept]
    assert (history.last_seq, history.last_t) == (699, 1699.0)
    new, old = gpu_series(history), old_gpu_series(kept, HISTORY_WINDOW)
    assert new == old
    pal = Palette()
    for g in kept[-1].gpus:  # the cards, sparklines included, render the same text
        assert gpu_card(g, new[g.index], pal).plain == gpu_card(g, old[g.index], pal).plain
    for idx in ({0}, {2, 3}, {3, 9}):  # the low-utilisation hint's input (9: no such GPU)
        expected = [
            sum(g.util_percent or 0 for g in s.gpus if g.index in idx) / len(idx) for s in kept[-120:]
        ]
        assert history.mean_util(idx, 120) == expected


def test_history_stays_bounded_and_a_published_view_never_changes() -> None:
    ring = MetricsRing(50)
    stream = samples(1000, gpus=4)
    views = []
    for s in stream:
        views.append(ring.append(s))
        store = ring._store
        assert len(store.seq) <= 50 + 50 // 4  # old samples go in batches: never more than capacity + slack
        assert all(len(rows.pos) <= len(store.seq) for rows in store.gpus.values())
    assert len(ring.view) == 50 and ring.view.seqs() == list(range(950, 1000))
    for n in (1, 49, 50, 63, 500, 999):  # each view still reads what it had when published
        v, kept = views[n], stream[max(0, n + 1 - 50) : n + 1]
        assert v.seqs() == [s.seq for s in kept]
        assert v.gpus(None) == old_gpu_series(kept, 50)


def test_history_is_a_few_objects_for_the_collector_however_many_samples() -> None:
    """A full collection walks every container object: these 600 samples as a tuple of dataclasses are 6,515
    of them (more with GPU processes; millions at 256 hosts); as a history, a few dozen whatever its length."""

    def tracked(root: object) -> int:
        seen, todo = {id(root)}, [root]
        while todo:
            for ref in gc.get_referents(todo.pop()):
                if gc.is_tracked(ref) and id(ref) not in seen and not isinstance(ref, type):
                    seen.add(id(ref))
                    todo.append(ref)
        return len(seen)

    small, big = MetricsHistory.of(samples(10)), MetricsHistory.of(samples(600))
    assert tracked(big) == tracked(small) < 60


def test_readings_that_are_not_numbers_are_unknown_not_a_crash() -> None:
    wire = {
        "index": 0,
        "util_percent": "93%",
        "mem_used_mib": 10**400,
        "mem_total_mib": True,
        "temp_c": float("nan"),
    }
    odd = M.GpuSample.from_wire(wire)  # type: ignore[arg-type]  # what a hostile host may send
    history = MetricsHistory.of([M.MetricsSample(seq=10**30, t=1.0, host=M.HostStats(), gpus=(odd,))])
    assert tuple(history.gpus()[0]) == ([None], [None], [None])
    assert history.last_seq == 2**63 - 1
