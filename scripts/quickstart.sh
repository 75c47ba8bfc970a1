#!/usr/bin/env bash
# Set up abwatch in ./.venv and run the bundled example: an A/B comparison of two tags of a
# small C benchmark (v1.0 against v1.2, which does 10% more work), on the local CPU, stored
# in the embedded SQLite database ./abwatch.db.
set -euo pipefail
cd "$(dirname "$0")/.."
python3 -m venv .venv
.venv/bin/pip install --quiet --upgrade pip
.venv/bin/pip install --quiet -e '.[test]'
[ -d .abwatch/example-repo/.git ] || .venv/bin/abwatch demo-repo .abwatch/example-repo
set +e
.venv/bin/abwatch compare --config config/example.toml --control v1.0 --treatment v1.2
status=$?
set -e
# Exit status 1 means "regression found", which is what this example is built to show.
if [ "$status" -eq 1 ]; then
  echo "abwatch found the 10% regression between v1.0 and v1.2 (exit status 1 = regression)."
  echo "Next: .venv/bin/abwatch verify <run id>   and   .venv/bin/abwatch regressions"
  exit 0
fi
exit "$status"
