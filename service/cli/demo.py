"""A small C benchmark project with a known performance history, made as a real git repo.

Used by the bundled example (``abwatch demo-repo``) and by the tests. Each step of the
history is one commit (and one tag) that sets how much work the benchmark loop does, so
the true change between two tags is known: work 2.2M against 2.0M is +10 %.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta, UTC
from email.utils import format_datetime
from pathlib import Path

import git

BENCH_C = r"""/* A dependent multiply-add chain: the compiler cannot vectorise or fold it,
 * so the time is proportional to WORK. Prints one JSON object per sample. */
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>
#include "work.h"
#ifndef BENCH_CLOCK
#define BENCH_CLOCK CLOCK_MONOTONIC
#endif

static double now_ms(void) {
    struct timespec t;
    clock_gettime(BENCH_CLOCK, &t);
    return t.tv_sec * 1e3 + t.tv_nsec / 1e6;
}

int main(int argc, char **argv) {
    int samples = argc > 1 ? atoi(argv[1]) : 5;
    long work = WORK;
#ifdef HANG
    for (;;) pause();
#endif
#ifdef ENV_FACTOR
    const char *factor = getenv(ENV_FACTOR);
    if (factor) work = (long)(work * atof(factor));
#endif
    volatile unsigned long sink = 0;
    for (int s = 0; s < samples; s++) {
        double t0 = now_ms();
        unsigned long x = 1;
        for (long i = 0; i < work; i++) x = x * 6364136223846793005UL + 1442695040888963407UL;
        sink += x;
        printf("{\"runtime_ms\": %.6f}\n", now_ms() - t0);
    }
    return 0;
}
"""

BUILD_SH = """#!/bin/sh
set -eu
mkdir -p out
cc -O2 -o out/bench bench.c
echo "built out/bench"
"""

BASE_WORK = 2_000_000


@dataclass(frozen=True)
class Step:
    """One commit of the history: its tag and how the benchmark behaves at it."""

    tag: str
    message: str
    work: int = BASE_WORK
    broken: bool = False
    hang: bool = False
    env_factor: str | None = None  # name of an env var that scales the work, if set
    note: str = ""  # changes README only: a commit with no effect on speed
    # time with the process's CPU clock: other load on a busy machine barely moves it
    cpu_clock: bool = False


DEMO_HISTORY = (
    Step("v1.0", "Initial benchmark"),
    Step("v1.1", "Document the benchmark (no code change)", note="Documentation only."),
    Step("v1.2", "Do 10% more work per sample", work=2_200_000),
)


def _work_h(step: Step) -> str:
    lines = [f"#define WORK {step.work}L"]
    if step.hang:
        lines.append("#define HANG 1")
    if step.env_factor:
        lines.append(f'#define ENV_FACTOR "{step.env_factor}"')
    if step.cpu_clock:
        lines.append("#define BENCH_CLOCK CLOCK_PROCESS_CPUTIME_ID")
    if step.broken:
        lines.append("this is not C;")
    return "\n".join(lines) + "\n"


def make_demo_repo(path: Path, history: tuple[Step, ...] = DEMO_HISTORY, branch: str = "main") -> list[str]:
    """Create (or extend) a git repository at ``path`` with one tagged commit per step."""
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    repo = git.Repo(path) if (path / ".git").exists() else git.Repo.init(path, initial_branch=branch)
    with repo.config_writer() as cfg:
        cfg.set_value("user", "name", "abwatch example")
        cfg.set_value("user", "email", "example@abwatch.invalid")
    for step in history:
        if step.tag in [t.name for t in repo.tags]:
            continue
        (path / "bench.c").write_text(BENCH_C)
        (path / "build.sh").write_text(BUILD_SH)
        (path / "work.h").write_text(_work_h(step))
        readme = path / "README.md"
        readme.write_text(f"# lcg-loop benchmark\n\n{step.note}\n")
        repo.index.add(["bench.c", "build.sh", "work.h", "README.md"])
        # One hour apart, so the history's order is also its commit-time order.
        count = int(repo.git.rev_list("--count", "HEAD")) if repo.head.is_valid() else 0
        date = format_datetime(datetime(2026, 1, 1, tzinfo=UTC) + timedelta(hours=count))
        repo.index.commit(step.message, author_date=date, commit_date=date)
        repo.create_tag(step.tag)
    return [step.tag for step in history]
