"""A job's life on the host: its record (store, index), the runner inside tmux, the queue, its log
and when each byte was written, its GPU usage, and Slurm as the other backend."""
