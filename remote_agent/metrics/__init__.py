"""GPU and host readings: the sampler, NVML, the nvidia-smi fallback, the on-disk ring."""
