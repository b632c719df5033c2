"""Getting the agent onto a host and started: the zipapp build, its unpacking and checks, the local agent process and its early start while the CLI imports."""
