#!/usr/bin/env bash
# Install everything the test suite needs, then run it all: Debian packages when root (tmux, sshd, cron, venv,
# Slurm, Docker's engine), a virtualenv in .venv (so a PEP 668 "externally managed" system python is never
# touched) with gputui installed editable and the extras .[test,train], a CPU build of torch when the package
# index offers one.
# Arguments go to pytest (after -n 4 --dist loadfile unless they set -n or -p no:xdist).
set -euo pipefail
cd "$(dirname "$0")/.."
venv=.venv

need=()
command -v tmux >/dev/null || need+=(tmux)
[ -x /usr/sbin/sshd ] || need+=(openssh-server)
command -v ssh >/dev/null || need+=(openssh-client)
command -v crontab >/dev/null || need+=(cron)  # tests/test_resume_on_boot.py: the real crontab
[ -x "$venv/bin/python" ] || python3 -c 'import ensurepip, venv' 2>/dev/null || need+=(python3-venv)
if [ "$(id -u)" = 0 ]; then  # a real single-node Slurm for tests/test_slurm.py (skipped without root)
  [ -x /usr/sbin/slurmctld ] || need+=(slurm-wlm)
  [ -x /usr/sbin/munged ] || need+=(munge)
  # a real Docker engine for tests/test_image_jobs.py (tests/docker_engine.py starts it on its own socket) and
  # the static busybox its test image is made of (no registry is reachable)
  [ -x /usr/sbin/dockerd ] || need+=(docker.io)
  [ -x /bin/busybox ] || need+=(busybox-static)
fi
if [ ${#need[@]} -gt 0 ]; then
  if [ "$(id -u)" = 0 ]; then
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need[@]}" >/dev/null
  else
    echo "missing Debian packages: ${need[*]}; install them: sudo apt-get install ${need[*]}" >&2
    exit 1
  fi
fi

[ -x "$venv/bin/python" ] || python3 -m venv "$venv"
py="$venv/bin/python"
pip=("$py" -m pip install -q --disable-pip-version-check)
# The tests train MNIST on the CPU only: a CPU build of torch is a few hundred MB where the default
# (CUDA) build pulls about 5 GB of CUDA wheels. Take the newest one the configured index offers, if any.
if ! "$py" -c 'import torch' 2>/dev/null; then
  cpu_torch=$("$py" -m pip index versions torch 2>/dev/null | sed -n 's/^Available versions: //p' \
    | tr ',' '\n' | tr -d ' ' | grep -m1 '+cpu$' || true)
  if [ -n "$cpu_torch" ]; then
    "${pip[@]}" "torch==$cpu_torch"
  else
    echo "no CPU build of torch on the package index: installing the default build" >&2
  fi
fi
"${pip[@]}" -e '.[test,train]'

export PATH="$PWD/$venv/bin:$PATH" VIRTUAL_ENV="$PWD/$venv"
python -m ruff check .
python -m mypy  # gputui/core (strict) and remote_agent/protocol.py: [tool.mypy] in pyproject.toml
# In parallel by default (pytest-xdist): most of the suite waits on sshd, tmux, Slurm and dockerd, not on a CPU.
# Each test file stays in one worker (--dist loadfile): the tests that share the host's root crontab or one
# Slurm cluster never overlap. `-n 0` (or `-p no:xdist`) runs one test at a time.
parallel=(-n 4 --dist loadfile)
for arg in "$@"; do
  case "$arg" in -n|-n*|--numprocesses*|no:xdist) parallel=() ;; esac
done
python -m pytest "${parallel[@]}" "$@"
