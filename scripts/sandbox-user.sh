#!/usr/bin/env bash
# Make this host ready to run code under test as its own unprivileged user (README, Security):
# the user `abwatch-sandbox` ([sandbox] user), and abwatch's Python within that user's reach
# (each directory on the way to the interpreter enterable by others: o+x, not o+r, so nothing
# in them can be listed). Run as root; says what it changed.
set -euo pipefail
cd "$(dirname "$0")/.."
user="${ABWATCH_SANDBOX_USER:-abwatch-sandbox}"
if [ "$(id -u)" -ne 0 ]; then
  echo "scripts/sandbox-user.sh: not root: code under test will run as your own user (see README, Security)" >&2
  exit 0
fi
if ! id "$user" >/dev/null 2>&1; then
  useradd --system --no-create-home --shell /usr/sbin/nologin "$user"
  echo "made the user $user, whom code under test runs as"
fi
python="${1:-python3}"
executable=$("$python" -c 'import sys; print(sys.executable)')
# the interpreter as abwatch starts it (a venv's link), where that link leads, and this
# checkout (its default cache_dir, .abwatch, holds the builds code under test runs)
for path in "$executable" "$(readlink -f "$executable")" "$PWD/.abwatch"; do
  dir=$(dirname "$path")
  while [ "$dir" != "/" ]; do
    mode=$(stat -c %a "$dir")
    if (( (${mode: -1} & 1) == 0 )); then
      chmod o+x "$dir"
      echo "chmod o+x $dir: $user must reach $path"
    fi
    dir=$(dirname "$dir")
  done
done
