#!/usr/bin/env bash
# Run abwatch's tests (README command 2; .ci/run calls it too). Installs what the tests need
# when it is missing: ./.venv with abwatch and its test tools, a C compiler, Valgrind, Debian's Chromium
# and ChromeDriver (the dashboard's browser tests; needs root for apt-get), nginx (the shared artifact store's
# tests start its WebDAV module), a running Redis on
# 127.0.0.1:6379 and a running PostgreSQL on 127.0.0.1:5432 (the tests use the real servers, never a mock).
# Arguments go to pytest, e.g. `bash scripts/test.sh -m "not slow"` for the fast subset.
# pytest's exit status is passed through; "no tests ran" (5) is a failure.
set -euo pipefail
cd "$(dirname "$0")/.."

apt_install() {
  if [ "$(id -u)" -ne 0 ]; then
    echo "scripts/test.sh: $* missing; install them (Debian: apt-get install $*) or run as root" >&2
    exit 1
  fi
  apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q "$@"
}

command -v cc >/dev/null || apt_install gcc
command -v valgrind >/dev/null || apt_install valgrind  # the instruction counter where perf cannot count
command -v bwrap >/dev/null || apt_install bubblewrap  # the sandbox of code under test (tests/test_sandbox.py)
# Debian's own ccache (4.7): a build tool too old for abwatch, refused before a build (tests/test_build_tools.py)
[ -x /usr/bin/ccache ] || apt_install ccache
# nginx's WebDAV module: the shared artifact store the fleet's tests start (tests/webdav.py)
command -v nginx >/dev/null || [ -x /usr/sbin/nginx ] || apt_install nginx
# real non-CPU drivers for the gpu runner's tests: Mesa's lavapipe (Vulkan) and pocl (OpenCL),
# both running on the CPU, with the tools that list their devices
if ! command -v vulkaninfo >/dev/null || ! command -v clinfo >/dev/null || ! ls /usr/share/vulkan/icd.d/lvp_icd.* >/dev/null 2>&1; then
  apt_install mesa-vulkan-drivers vulkan-tools pocl-opencl-icd clinfo
fi
# several hosts on this machine (tests/netns.py): network namespaces (iproute2) and socat,
# which makes the local PostgreSQL reachable from them
command -v ip >/dev/null || apt_install iproute2
command -v socat >/dev/null || apt_install socat
if ! command -v chromium >/dev/null || ! command -v chromedriver >/dev/null; then
  apt_install chromium chromium-driver
fi

# Redis on 127.0.0.1:6379: the shared compiler cache's tests (ccache's remote storage); they
# also start password-protected redis-server processes of their own
command -v redis-server >/dev/null && command -v redis-cli >/dev/null || apt_install redis-server
if [ "$(redis-cli -h 127.0.0.1 -p 6379 ping 2>/dev/null)" != "PONG" ]; then
  redis-server --bind 127.0.0.1 --port 6379 --save '' --appendonly no --daemonize yes
  for _ in $(seq 1 30); do [ "$(redis-cli -h 127.0.0.1 -p 6379 ping 2>/dev/null)" = "PONG" ] && break; sleep 1; done
fi

if ! pg_isready -h 127.0.0.1 -p 5432 -q 2>/dev/null; then
  version=$(ls /etc/postgresql 2>/dev/null | head -n1)
  [ -n "$version" ] || { echo "scripts/test.sh: no PostgreSQL server here (the tests need one on 127.0.0.1:5432)" >&2; exit 1; }
  pg_ctlcluster --skip-systemctl-redirect "$version" main start
  for _ in $(seq 1 30); do pg_isready -h 127.0.0.1 -p 5432 -q && break; sleep 1; done
fi
pg_isready -h 127.0.0.1 -p 5432

if ! .venv/bin/python -c "import pytest, xdist" 2>/dev/null; then
  python3 -m venv .venv
  .venv/bin/pip install --quiet --upgrade pip
  .venv/bin/pip install --quiet -e '.[test,source]'
  .venv/bin/pip install --quiet --no-deps 'apache-otava==0.8.0'
fi

# code under test runs as its own unprivileged user (tests/test_hostile_fork.py): made here when root
bash scripts/sandbox-user.sh .venv/bin/python

# Four pytest workers a CPU (pytest-xdist; at most 8): a test spends much of its time waiting on
# processes, servers, sleeps and the database, and a busy host shares its CPUs thread by thread,
# so more workers than CPUs overlap the waits (the suite's time with 2, 6 and 8 workers on 2
# cores: README, "Development"). Each test's databases, ports, network namespaces and temporary
# files are its own. ABWATCH_TEST_WORKERS=N sets the number; 0 runs them in this process.
# worksteal: a worker that runs out of tests takes queued ones from another (the longest tests
# take minutes on a busy host, and tests handed out early would otherwise wait behind them).
workers=${ABWATCH_TEST_WORKERS:-$((4 * $(nproc)))}
[ "$workers" -le 8 ] || workers=8

set +e
.venv/bin/python -m pytest -n "$workers" --dist worksteal "$@"
status=$?
set -e
if [ "$status" -eq 5 ]; then
  echo "scripts/test.sh: pytest collected no tests" >&2
  exit 1
fi
exit "$status"
