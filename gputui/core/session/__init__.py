"""What the client knows about a host, kept up to date: the HostSession across link drops, its immutable snapshots (model), metrics history, job series, and one action gathered over many hosts."""
