"""The agent's on-disk metrics ring: one sampler per state dir, seq continuing across agents, bounded."""

from __future__ import annotations

from pathlib import Path

from remote_agent.metrics.ring import MetricsRing


def test_one_sampler_and_seq_continues_across_agents(tmp_path: Path) -> None:
    first, second = MetricsRing(str(tmp_path)), MetricsRing(str(tmp_path))
    assert first.try_own() and not second.try_own()  # the flock decides; cheap to retry every tick
    for t in range(3):
        first.append({"t": float(t)})
    assert [s["seq"] for s in second.since(1)] == [2, 3] and second.last_seq() == 3
    first.release()  # the sampling agent died
    assert second.try_own()
    assert second.append({"t": 3.0})["seq"] == 4
    assert [s["seq"] for s in MetricsRing(str(tmp_path)).since(0)] == [1, 2, 3, 4]


def test_torn_last_line_is_dropped_before_appending(tmp_path: Path) -> None:
    ring = MetricsRing(str(tmp_path))
    assert ring.try_own()
    ring.append({"t": 0.0})
    ring.release()
    with open(ring.path, "ab") as f:
        f.write(b'{"t": 1.0, "se')  # an agent killed mid-write
    again = MetricsRing(str(tmp_path))
    assert again.try_own() and again.append({"t": 2.0})["seq"] == 2
    assert [s["seq"] for s in again.since(0)] == [1, 2]


def test_ring_stays_bounded_and_readers_follow_compaction(tmp_path: Path) -> None:
    writer, reader = MetricsRing(str(tmp_path), maxlen=5), MetricsRing(str(tmp_path), maxlen=5)
    assert writer.try_own()
    seen: list[int] = []
    for t in range(23):
        writer.append({"t": float(t)})
        new = reader.since(seen[-1] if seen else 0)
        seen += [s["seq"] for s in new]
    assert seen == list(range(1, 24))  # nothing skipped or repeated across compactions
    assert len(Path(writer.path).read_bytes().splitlines()) < 10
