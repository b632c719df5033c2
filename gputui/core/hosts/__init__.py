"""The fleet of configured hosts and what a user does to one: add or remove it in the config, trust its key, run the doctor, read a Slurm cluster."""
