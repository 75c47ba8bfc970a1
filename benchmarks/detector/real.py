"""Real trials on this machine: the C benchmark built at two work settings by abwatch's
builder and run through abwatch's CPU runner, in abwatch's interleaved order."""

from __future__ import annotations

import random
import tempfile
from pathlib import Path

from benchmarks.detector.rules import Trial
from abwatch.core.sides import CONTROL
from abwatch.builders import CommandBuilder
from abwatch.runners import CpuRunner
from abwatch.runners.harness import interleaved_schedule
from abwatch.service.config import CommandBuildConfig, CommandWorkloadConfig, Config, RepoConfig, RunnerConfig
from abwatch.service.cli.demo import Step, make_demo_repo

WORK = 2_000_000  # ~2 ms a sample


class RealBench:
    """Builds of the benchmark at base work and at each injected change."""

    def __init__(self, changes: list[float], samples: int = 5) -> None:
        self._tmp = tempfile.TemporaryDirectory(prefix="abwatch-detector-")
        root = Path(self._tmp.name)
        steps = [Step("base", "base", work=WORK), Step("same", "identical code", work=WORK, note="A/A")]
        steps += [Step(f"plus{c:g}", f"+{c:g}%", work=round(WORK * (1 + c / 100))) for c in changes]
        make_demo_repo(root / "repo", tuple(steps))
        self.workload = CommandWorkloadConfig(name="loop", command=["./bench", str(samples)])
        config = Config(repo=RepoConfig(url=str(root / "repo")), cache_dir=root / "cache",
                        build=CommandBuildConfig(command=["sh", "build.sh"], artifacts="out"),
                        workloads=[self.workload])
        builder = CommandBuilder(config)
        self.paths = {step.tag: builder.build(builder.resolve(step.tag).sha).path for step in steps}
        self.runner = CpuRunner(RunnerConfig(device="detector"))

    def trial(self, treatment_tag: str, pairs: int, seed: int, layout: str = "interleaved") -> Trial:
        """Run ``pairs`` processes a side of base against ``treatment_tag``."""
        if layout == "interleaved":
            order = [s.side for s in interleaved_schedule(pairs, 0, random.Random(seed))]
        else:
            order = [CONTROL] * pairs + ["treatment"] * pairs
        self.runner.run(self.paths["base"], self.workload, 30)  # warm-up, discarded
        control, treatment = [], []
        for side in order:
            path = self.paths["base"] if side == CONTROL else self.paths[treatment_tag]
            result = self.runner.run(path, self.workload, 30)
            if result.status != "ok":
                raise RuntimeError(f"benchmark failed: {result.message}")
            (control if side == CONTROL else treatment).append(list(result.samples))
        return Trial(control, treatment)

    def close(self) -> None:
        """Remove the builds."""
        self._tmp.cleanup()
