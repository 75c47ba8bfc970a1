"""Ground-truth suite: false positives and power of abwatch's rule against the anchors.

    python -m benchmarks.detector                 # simulation and real runs (~15 min here)
    python -m benchmarks.detector --skip-real     # simulation only (~2 min)

Prints Markdown tables: per noise shape (simulated) and for real runs on this machine, the
A/A false-positive rate and the power at each injected slowdown, with 95 % Wilson
intervals, and the mean samples each rule used; then interleaved against back-to-back
blocks. abwatch looks again (up to 36 processes) only while its verdict is `unknown`.
Each anchor is shown twice on the same trials: "@60" judges the first look's data
(12 processes x 5 samples a side), "@180" the whole budget (36 processes).
"""

from __future__ import annotations

import argparse
import sys
import time

import numpy as np

from benchmarks.detector import rules, simulate
from benchmarks.detector.rules import ANCHORS, Budget, Decision, Trial

EFFECTS = (0.5, 1.0, 2.0, 5.0, 10.0)
BUDGET = Budget()


def judge(trials: list[Trial], seed: int) -> dict[str, list[Decision]]:
    """Every rule's decision on every trial."""
    out: dict[str, list[Decision]] = {"abwatch (paired, adaptive)": []}
    sizes = (BUDGET.start, BUDGET.most)  # anchors at the first look's data and at the whole budget
    out.update({f"{name} @{k * 5}": [] for name in ANCHORS for k in sizes})
    for i, t in enumerate(trials):
        out["abwatch (paired, adaptive)"].append(rules.abwatch(t, BUDGET, seed=seed + i))
        for name, rule in ANCHORS.items():
            for k in sizes:
                out[f"{name} @{k * 5}"].append(rule(t, k))
    return out


def table(title: str, by_effect: dict[float, dict[str, list[Decision]]]) -> str:
    """Markdown: A/A false positives, power per effect, mean samples, smallest 95 %-power effect."""
    effects = [e for e in by_effect if e > 0]
    head = (["rule", "A/A false pos."] + [f"+{e:g}%" for e in effects]
            + ["mean samples/side: A/A", "slowdowns", "95% power at"])
    lines = [f"### {title}", "", "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for name in by_effect[0.0]:
        cells = [name, rules.rate([d.call for d in by_effect[0.0][name]], 0)]
        smallest = "-"
        for e in effects:
            calls = [d.call for d in by_effect[e][name]]
            cells.append(rules.rate(calls, 1))
            if smallest == "-" and sum(c == 1 for c in calls) >= 0.95 * len(calls):
                smallest = f"+{e:g}%"
        slowdowns = [d.samples for e in effects for d in by_effect[e][name]]
        cells += [f"{np.mean([d.samples for d in by_effect[0.0][name]]):.0f}", f"{np.mean(slowdowns):.0f}", smallest]
        lines.append("| " + " | ".join(cells) + " |")
    n = {e: len(next(iter(v.values()))) for e, v in by_effect.items()}
    lines += ["", f"Trials: A/A {n[0.0]}, each slowdown {n[effects[0]] if effects else 0}.", ""]
    return "\n".join(lines)


def layout_table(title: str, rows: dict[str, dict[str, list[Decision]]]) -> str:
    """Markdown: A/A false positives and +2 % power, interleaved vs blocks."""
    head = ["rule"] + [f"{layout}: {what}" for layout in rows for what in ("A/A false pos.", "+2% power")]
    lines = [f"### {title}", "", "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    names = next(iter(rows.values()))["aa"].keys()
    for name in names:
        cells = [name]
        for layout in rows.values():
            cells += [rules.rate([d.call for d in layout["aa"][name]], 0),
                      rules.rate([d.call for d in layout["plus2"][name]], 1)]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines + [""])


def simulation(args) -> None:
    rng = np.random.default_rng(args.seed)
    for shape in simulate.SHAPES:
        started = time.monotonic()
        by_effect = {}
        for effect in (0.0, *EFFECTS):
            count = args.sim_trials if effect == 0 else args.sim_effect_trials
            trials = [simulate.trial(rng, shape, effect / 100, BUDGET.most) for _ in range(count)]
            by_effect[effect] = judge(trials, args.seed)
        print(table(f"Simulated: {shape}", by_effect))
        print(f"({time.monotonic() - started:.0f}s)\n", file=sys.stderr)
    rows = {}
    for layout in ("interleaved", "blocks"):
        aa = [simulate.trial(rng, "phases", 0.0, BUDGET.most, layout=layout) for _ in range(args.sim_trials)]
        plus2 = [simulate.trial(rng, "phases", 0.02, BUDGET.most, layout=layout) for _ in range(args.sim_effect_trials)]
        rows[layout] = {"aa": judge(aa, args.seed), "plus2": judge(plus2, args.seed)}
    print(layout_table("Simulated 'phases': interleaved vs back-to-back blocks", rows))


def real(args) -> None:
    from benchmarks.detector.real import RealBench

    bench = RealBench(list(EFFECTS[1:]))
    try:
        by_effect, started = {}, time.monotonic()
        for effect in (0.0, *EFFECTS[1:]):
            tag = "same" if effect == 0 else f"plus{effect:g}"
            count = args.real_trials if effect == 0 else args.real_effect_trials
            trials = []
            for i in range(count):
                trials.append(bench.trial(tag, BUDGET.most, seed=args.seed + i))
                if i % 20 == 19:
                    print(f"  real {tag}: {i + 1}/{count} ({time.monotonic() - started:.0f}s)", file=sys.stderr)
            by_effect[effect] = judge(trials, args.seed)
        print(table("Real runs on this machine (C loop, ~2 ms a sample)", by_effect))
        rows = {}
        for layout in ("interleaved", "blocks"):
            aa = [bench.trial("same", BUDGET.most, args.seed + i, layout) for i in range(args.real_layout_trials)]
            plus2 = [bench.trial("plus2", BUDGET.most, args.seed + i, layout) for i in range(args.real_layout_trials)]
            rows[layout] = {"aa": judge(aa, args.seed), "plus2": judge(plus2, args.seed)}
        print(layout_table("Real runs: interleaved vs back-to-back blocks", rows))
    finally:
        bench.close()


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.detector", description=__doc__.split("\n\n")[0])
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--sim-trials", type=int, default=400, help="simulated A/A trials per shape")
    parser.add_argument("--sim-effect-trials", type=int, default=150)
    parser.add_argument("--real-trials", type=int, default=400, help="real A/A trials")
    parser.add_argument("--real-effect-trials", type=int, default=60)
    parser.add_argument("--real-layout-trials", type=int, default=60)
    parser.add_argument("--skip-real", action="store_true")
    parser.add_argument("--skip-sim", action="store_true")
    args = parser.parse_args()
    print(f"Budget: first look {BUDGET.start} processes a side, +{BUDGET.step} per look, at most "
          f"{BUDGET.most} ({BUDGET.looks} looks); 5 samples a process.\n")
    if not args.skip_sim:
        simulation(args)
    if not args.skip_real:
        real(args)


if __name__ == "__main__":
    main()
