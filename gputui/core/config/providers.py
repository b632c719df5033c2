"""Provider settings as the config holds them: the names a host's ``provider`` may take, which have a
``[providers.NAME]`` table, the release modes and which provider cannot stop. The clients behind these names
are in ``gputui.core.money.providers`` (Lambda, here) and ``remote_agent.host.provider`` (RunPod, vast.ai)."""

from __future__ import annotations

from remote_agent.host import provider as agent_provider

ProviderError = agent_provider.ProviderError
check_api_url = agent_provider.check_api_url

AUTO, RUNPOD, VASTAI, LAMBDA, NONE = "auto", "runpod", "vastai", "lambda", "none"
PROVIDERS = (AUTO, RUNPOD, VASTAI, LAMBDA, NONE)  # the host setting ``provider``
API_PROVIDERS = (RUNPOD, VASTAI, LAMBDA)  # those with a ``[providers.NAME]`` table
RELEASE_MODES = agent_provider.MODES  # "stop", "terminate"
API_URLS = {**agent_provider.API_URLS, LAMBDA: "https://cloud.lambdalabs.com/api/v1"}
# Why a provider cannot stop (keep the disk, stop the compute bill); absent: it can.
NO_STOP = {LAMBDA: "Lambda has no stop: an instance can only be terminated"}


def default_release_mode(provider: str) -> str:
    """``release_mode`` where the config sets none: stop where the provider can, else terminate."""
    return "terminate" if provider in NO_STOP else "stop"


def release_mode_problem(provider: str, mode: str) -> str | None:
    """Why ``mode`` cannot work for ``provider`` (None: it can, or it cannot be known before the host is seen)."""
    if mode not in RELEASE_MODES:
        return f"must be one of {', '.join(RELEASE_MODES)}, not {mode!r}"
    if mode == "stop" and provider in NO_STOP:
        return NO_STOP[provider] + ' (set release_mode = "terminate")'
    return None
