"""Metrics ops: metrics.sample (one fresh reading), metrics.subscribe (pushed readings from the ring)."""

from typing import TYPE_CHECKING

from .. import protocol as P

if TYPE_CHECKING:
    from ..server import Agent

#: Shortest metrics interval a client may ask for.
MIN_INTERVAL_S = 0.1


def sample(agent: "Agent", a: P.IdleRule) -> P.MetricsSample:
    """A fresh sample; it joins the ring only if this agent is the sampler (else it carries the ring's seq)."""
    agent.set_idle_rule(a)
    reading = agent.take_sample()
    with agent.ring_lock:
        if agent.ring.owner:
            return agent.ring.append(reading)
    with agent.push_lock:
        reading["seq"] = agent.ring.last_seq()
    return reading


def subscribe(agent: "Agent", a: P.SubscribeArgs) -> P.SubscribeResult:
    """Start (or retune) pushed metrics; samples newer than ``since_seq`` still in the ring are resent."""
    unsubscribe = "interval" in a and a["interval"] is None
    interval = None if unsubscribe else P.number_arg(a, "interval", 1.0, MIN_INTERVAL_S, 3600.0)
    since = None if a.get("since_seq") is None else P.int_arg(a, "since_seq", 0)
    agent.set_idle_rule(a)
    agent.metrics_interval = interval
    with agent.push_lock:
        if interval is None:
            agent.pushed_seq = None
        else:
            last = agent.ring.last_seq()
            start = last if since is None or int(since) > last else int(since)
            # The backlog goes out as events, in order and before anything newer can be pushed.
            for backlog in agent.ring.since(start):
                agent.emit(P.EV_METRICS, backlog)
                start = backlog["seq"]
            agent.pushed_seq = start
    agent.metrics_wake.set()
    return {"interval": interval, "backlog": []}


HANDLERS = {P.OP_METRICS_SAMPLE: sample, P.OP_METRICS_SUBSCRIBE: subscribe}
