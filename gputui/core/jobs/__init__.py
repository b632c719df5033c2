"""Jobs for both frontends: the use cases (start, list, history), run records, compare, which metrics head a table, Slurm task labels, and the cache of ended jobs' insights."""
