"""The detached watchdog (autostop, deadlines, the queue with no client), what counts as activity,
notifications, stalled jobs."""
