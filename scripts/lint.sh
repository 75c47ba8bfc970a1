#!/usr/bin/env bash
# The linter and the type checker over abwatch's code (settings: pyproject.toml).
# mypy checks the installed names (abwatch.service, ...): the folders are linked under an
# `abwatch` directory for it, since it cannot follow the editable install's import hook.
set -euo pipefail
cd "$(dirname "$0")/.."
.venv/bin/ruff check .
tree=$(mktemp -d)
trap 'rm -rf "$tree"' EXIT
mkdir "$tree/abwatch"
for package in service builders runners core migrations; do ln -s "$PWD/$package" "$tree/abwatch/$package"; done
MYPYPATH="$tree" .venv/bin/mypy -p abwatch.service -p abwatch.builders -p abwatch.runners -p abwatch.core
