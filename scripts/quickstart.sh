#!/usr/bin/env bash
# Set up abwatch in ./.venv and run the main job on the embedded defaults: an A/B comparison
# of two apache-tvm releases (0.26.0 against 0.27.0.post1) on built-in workloads, on the local
# CPU, stored in the SQLite database ./abwatch.db. Then the small C example, whose tag v1.2
# does 10% more work than v1.0, to show a regression being caught.
set -euo pipefail
cd "$(dirname "$0")/.."
# bubblewrap: the sandbox code under test runs in (README, Security); without it abwatch runs
# that code bare, with a warning
if ! command -v bwrap >/dev/null; then
  if [ "$(id -u)" -eq 0 ] && command -v apt-get >/dev/null; then
    apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q bubblewrap
  else
    echo "quickstart: no bubblewrap here, so code under test runs unsandboxed; install it first (Debian: sudo apt-get install bubblewrap)" >&2
  fi
fi
python3 -m venv .venv
.venv/bin/pip install --quiet --upgrade pip
# not --quiet: a minute of downloads shows what it is doing
.venv/bin/pip install --progress-bar on -e '.[test,source]'
# the change-point algorithm alone, without its BigQuery/Slack/PostgreSQL integrations
.venv/bin/pip install --progress-bar on --no-deps 'apache-otava==0.8.0'
# code under test runs as its own unprivileged user (README, Security): made here when root
bash scripts/sandbox-user.sh .venv/bin/python

run() {  # exit status 1 means "regression found": a finding, not a failure of the script
  set +e
  "$@"
  local status=$?
  set -e
  if [ "$status" -gt 1 ]; then exit "$status"; fi
  return 0
}

echo "== TVM 0.26.0 -> 0.27.0.post1 (first run installs both wheels into cached venvs)"
run .venv/bin/abwatch compare --config config/tvm-example.toml --control 0.26.0 --treatment 0.27.0.post1

echo "== the C example: v1.0 -> v1.2 (10% more work)"
[ -d .abwatch/example-repo/.git ] || .venv/bin/abwatch demo-repo .abwatch/example-repo
run .venv/bin/abwatch compare --config config/example.toml --control v1.0 --treatment v1.2
echo "Next: .venv/bin/abwatch regressions, .venv/bin/abwatch verify <run id>, .venv/bin/abwatch history <workload>"
