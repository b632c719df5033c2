#!/usr/bin/env bash
# Install everything the test suite needs (Debian packages when root, pip extras), then run it all.
set -euo pipefail
cd "$(dirname "$0")/.."

need=()
command -v tmux >/dev/null || need+=(tmux)
[ -x /usr/sbin/sshd ] || need+=(openssh-server)
command -v ssh >/dev/null || need+=(openssh-client)
if [ ${#need[@]} -gt 0 ]; then
  if [ "$(id -u)" = 0 ]; then
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need[@]}" >/dev/null
  else
    echo "missing Debian packages: ${need[*]}; install them: sudo apt-get install ${need[*]}" >&2
    exit 1
  fi
fi

python3 -m pip install -q --disable-pip-version-check -e '.[test,train]'
python3 -m ruff check .
python3 -m pytest "$@"
