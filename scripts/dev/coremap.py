"""Old flat gputui.core module -> new domain package module (issue 36)."""
MAP = {
    "config": "config.file",
    "agent_install": "deploy.install",
    "agentproc": "deploy.agentproc",
    "bundle": "deploy.bundle",
    "earlystart": "deploy.earlystart",
    "link": "transport.link",
    "transport": "transport.base",
    "ssh_transport": "transport.ssh",
    "ssh_resolve": "transport.ssh_config",
    "sshlib": "transport.sshlib",
    "known_hosts": "transport.known_hosts",
    "session": "session.host",
    "model": "session.model",
    "metrics_history": "session.metrics_history",
    "series": "session.series",
    "gather": "session.gather",
    "sync": "files.sync",
    "pull": "files.pull",
    "pulled": "files.pulled",
    "artifacts": "files.artifacts",
    "forward": "files.forward",
    "fileswire": "files.wire",
    "cost": "money.cost",
    "spend": "money.spend",
    "release": "money.release",
    "autostop": "money.autostop",
    "providers": "money.providers",
    "jobs": "jobs.usecases",
    "records": "jobs.records",
    "compare": "jobs.compare",
    "headline": "jobs.headline",
    "labels": "jobs.labels",
    "secrets": "jobs.secrets",
    "insights_cache": "jobs.insights_cache",
    "fleet": "hosts.fleet",
    "hostedit": "hosts.edit",
    "trust": "hosts.trust",
    "doctor": "hosts.doctor",
    "cluster": "hosts.cluster",
}
LEAVES = ["errors", "paths", "safetext", "durations", "jsonout"]
PKG_DOCS = {
    "config": "The user's config file: where it is, what it may hold, and errors that name file, line and field.",
    "deploy": "Getting the agent onto a host and started: the zipapp build, its unpacking and checks, the local "
    "agent process and its early start while the CLI imports.",
    "transport": "Byte streams to an agent: the Link (the client's end of the agent protocol), the local "
    "subprocess transport, the SSH transport over one asyncssh connection, and known_hosts files.",
    "session": "What the client knows about a host, kept up to date: the HostSession across link drops, its "
    "immutable snapshots (model), metrics history, job series, and one action gathered over many hosts.",
    "files": "Files between here and a host: sync (up), pull (down), what was pulled, artifacts to bring back "
    "before a release, and port forwards.",
    "money": "What hosts cost and how the bill stops: prices and the ledger, spend and budgets, releasing a host "
    "(commands or the provider's API), autostop, and the provider clients.",
    "jobs": "Jobs for both frontends: the use cases (start, list, history), run records, compare, which metrics "
    "head a table, Slurm task labels, and the cache of ended jobs' insights.",
    "hosts": "The fleet of configured hosts and what a user does to one: add or remove it in the config, trust "
    "its key, run the doctor, read a Slurm cluster.",
}
