"""Headless core of gputui: everything both frontends (the app, the CLI) do, by domain. Never imports textual.

Packages, from the bottom up (a package imports only itself, the packages below it and the leaves):

=============  =========================================================================================
leaves         ``errors`` (exit statuses), ``paths`` (our files here), ``safetext`` (host text made safe),
               ``durations``, ``jsonout``
``config``     the user's config file: what it may hold, errors naming file, line and field
``insights``   reading a training log: progress, ETA, metrics, hints
``deploy``     the agent build, its unpacking on a host, the local agent process and its early start
``transport``  the Link (agent protocol, client end), local and SSH transports, known_hosts files, the provider
               instance each host is and where its provider moved its SSH (instances.json)
``session``    one host's HostSession across link drops, its snapshots (model), metrics history, series
``files``      sync, pull, what was pulled, artifacts, port forwards
``money``      prices and the ledger, spend and budgets, release, autostop, provider clients, an instance's life
               (gputui start, stopped / preempted: lifecycle)
``jobs``       job use cases (run, list, history), jobs over several hosts, run records, compare,
               headline metrics, insights cache
``hosts``      the fleet, add/remove in the config, trust a host key, doctor, Slurm cluster view
=============  =========================================================================================
"""
