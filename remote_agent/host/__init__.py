"""Facts about the host: boot, /proc, containers and cgroups, CPU/memory stats, the doctor's checks,
the GPU cloud it runs on."""
