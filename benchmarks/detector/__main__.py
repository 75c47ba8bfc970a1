"""Ground-truth suite: false positives and power of abwatch's rule against the anchors.

    python -m benchmarks.detector                 # simulation and real runs
    python -m benchmarks.detector --skip-real     # simulation only (~20 min at load 8 on 2 cores)
    python -m benchmarks.detector --skip-sim --real-file T.jsonl   # judge trials saved by .collect

Prints Markdown tables: per noise shape (simulated) and for real runs on this machine, the
A/A false-positive rate and the power at each injected slowdown, with 95 % Wilson
intervals, and the mean samples each rule used; abwatch's confidence sequence against
Lan-DeMets spending on the same looks; then interleaved against back-to-back blocks. abwatch looks again (up to 36 processes) only while its verdict is `unknown`.
Each anchor is shown twice on the same trials: "@60" judges the first look's data
(12 processes x 5 samples a side), "@180" the whole budget (36 processes).
"""

from __future__ import annotations

import argparse
import gzip
import math
import sys
import time

import numpy as np

from benchmarks.detector import rules, simulate
from benchmarks.detector.rules import ANCHORS, Budget, Decision, Trial

EFFECTS = (0.5, 1.0, 2.0, 5.0, 10.0)
BUDGET = Budget()


POOLED = "abwatch pooled, no labels (10th-percentile shift)"
HL = "Hodges-Lehmann, pooled (previous pooled path)"
CS = "abwatch (paired, adaptive)"
LD = "Lan-DeMets OBF (paired, same looks; horizon: pair cap)"
LD_TIME = "Lan-DeMets OBF (horizon: pairs the time budget buys at look 1's pace)"
# one A/A trial judged with 1, 5, 20 or 100 looks over the same 103 pairs
LOOKS = {1: Budget(103, 1, 103), 5: Budget(23, 20, 103), 20: Budget(8, 5, 103), 100: Budget(4, 1, 103)}


def judge(trials: list[Trial], seed: int, budget: Budget = BUDGET,
          sizes: tuple[int, ...] | None = None, ld_horizon: int | None = None) -> dict[str, list[Decision]]:
    """Every rule's decision on every trial: abwatch's stopping rule, Lan-DeMets spending on the
    same looks (horizon ``ld_horizon`` pairs, default the pair cap: fixed before any data),
    the pooled path and the anchors on the same pooled samples (at the first look's data and
    at the whole budget)."""
    out: dict[str, list[Decision]] = {CS: [], LD: []}
    timed = not math.isinf(budget.max_seconds)
    if timed:
        out[LD_TIME] = []
    sizes = sizes or (budget.start, budget.most)
    out.update({f"{name} @{k * 5}": [] for name in (POOLED, HL, *ANCHORS) for k in sizes})
    for i, t in enumerate(trials):
        out[CS].append(rules.abwatch(t, budget, seed=seed + i))
        out[LD].append(rules.lan_demets(t, budget, horizon=ld_horizon or budget.most))
        if timed:
            out[LD_TIME].append(rules.lan_demets(t, budget))
        for k in sizes:
            out[f"{POOLED} @{k * 5}"].append(rules.abwatch(t, Budget(start=k), seed=seed + i, groups=False))
            out[f"{HL} @{k * 5}"].append(rules.hodges_lehmann(t, k))
            for name, rule in ANCHORS.items():
                out[f"{name} @{k * 5}"].append(rule(t, k))
    return out


def coverage(decisions: list[Decision], truth_pct: float) -> tuple[int, int, float]:
    """(intervals containing the truth, intervals, median |upper - estimate| / |estimate - lower|)."""
    with_ci = [d for d in decisions if d.ci_pct is not None]
    hits = sum(d.ci_pct[0] <= truth_pct <= d.ci_pct[1] for d in with_ci)
    skew = [(d.ci_pct[1] - d.change_pct) / (d.change_pct - d.ci_pct[0]) for d in with_ci
            if d.change_pct - d.ci_pct[0] > 0]
    return hits, len(with_ci), float(np.median(skew)) if skew else float("nan")


def looks_table(rng, args) -> str:
    """Markdown: A/A false positives of the confidence sequence and of Lan-DeMets spending at
    1, 5, 20, 100 looks per shape (the same trials, the same looks; horizon 103 pairs), and
    Lan-DeMets with a 36-pair horizon on runs that may go on to 103 pairs: stopped at the
    horizon, or looking on past it with the spending function carried past t = 1."""
    head = ["shape", "rule"] + [f"{k} look{'s' if k > 1 else ''}: A/A false pos. (pairs)" for k in LOOKS]
    lines = ["### Sequential validity: A/A false positives by number of looks (103 pairs at most)", "",
             "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    rows = {"confidence sequence (abwatch)": lambda t, b, i: rules.abwatch(t, b, seed=args.seed + i),
            "Lan-DeMets OBF, horizon 103": lambda t, b, i: rules.lan_demets(t, b, horizon=103),
            "Lan-DeMets OBF, horizon 36, stop there": lambda t, b, i: rules.lan_demets(t, b, horizon=36),
            "Lan-DeMets OBF, horizon 36, spending carried past it":
                lambda t, b, i: rules.lan_demets(t, b, horizon=36, past_horizon="extend")}
    for shape in simulate.SHAPES:
        trials = [simulate.trial(rng, shape, 0.0, 103) for _ in range(args.sim_trials)]
        for name, rule in rows.items():
            cells = [shape, name]
            for budget in LOOKS.values():
                ds = [rule(t, budget, i) for i, t in enumerate(trials)]
                cells.append(f"{rules.rate([d.call for d in ds], 0)} ({np.mean([d.samples for d in ds]) / 5:.0f})")
            lines.append("| " + " | ".join(cells) + " |")
        print(f"  looks: {shape} done", file=sys.stderr)
    return "\n".join(lines + ["", f"Trials: {args.sim_trials} per shape; the same trials at every look count "
                                  "and for every rule.", ""])


def sequential_table(results: dict[str, dict[float, dict[str, list[Decision]]]]) -> str:
    """Markdown: the confidence sequence against Lan-DeMets spending on the same trials and
    looks: A/A false positives, power per slowdown, mean pairs at the stop."""
    effects = [e for e in next(iter(results.values())) if e > 0]
    head = ["shape", "rule", "A/A false pos."] + [f"+{e:g}%" for e in effects] + ["mean pairs: A/A", "slowdowns"]
    lines = ["### Confidence sequence vs Lan-DeMets spending (same trials, same looks: 12 pairs, +6, at most 36)",
             "", "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for shape, by_effect in results.items():
        for name in (CS, LD):
            cells = [shape, name, rules.rate([d.call for d in by_effect[0.0][name]], 0)]
            cells += [rules.rate([d.call for d in by_effect[e][name]], 1) for e in effects]
            cells += [f"{np.mean([d.samples for d in by_effect[0.0][name]]) / 5:.1f}",
                      f"{np.mean([d.samples for e in effects for d in by_effect[e][name]]) / 5:.1f}"]
            lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines + [""])


def coverage_table(title: str, by_effect: dict[float, dict[str, list[Decision]]], truth=None) -> str:
    """Markdown: how often abwatch's interval (at the look it stopped) held the true change."""
    lines = [f"### {title}", "", "| change | paired: CI held the truth | paired: upper/lower half | "
             "pooled @60: CI held the truth | pooled: upper/lower half |", "|---|---|---|---|---|"]
    for effect, rows in by_effect.items():
        true_pct = truth(effect) if truth else effect
        cells = [f"+{effect:g}%"]
        for name in (CS, f"{POOLED} @{BUDGET.start * 5}"):
            hits, n, skew = coverage(rows[name], true_pct)
            lo, hi = rules.wilson(hits, n)
            cells += [f"{100 * hits / max(n, 1):.1f}% [{100 * lo:.1f}, {100 * hi:.1f}] of {n}", f"{skew:.2f}"]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines + [""])


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
    print(looks_table(rng, args))
    results = {}
    for shape in simulate.SHAPES:
        started = time.monotonic()
        by_effect = {}
        for effect in (0.0, *EFFECTS):
            count = args.sim_trials if effect == 0 else args.sim_effect_trials
            trials = [simulate.trial(rng, shape, effect / 100, BUDGET.most) for _ in range(count)]
            by_effect[effect] = judge(trials, args.seed)
        results[shape] = by_effect
        print(table(f"Simulated: {shape}", by_effect))
        print(coverage_table(f"Simulated: {shape}: interval coverage (nominal 99 %)", by_effect))
        print(f"({time.monotonic() - started:.0f}s)\n", file=sys.stderr)
    print(sequential_table(results))
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


def real_file(args) -> None:
    """Judge trials saved by ``benchmarks.detector.collect`` with the driver's defaults and a
    time budget of ``--budget-s`` per workload, replayed on the processes' wall times."""
    import json

    by_tag: dict[str, list[Trial]] = {}
    loads = []
    # recorded trials may be kept gzipped (benchmarks/detector/data/)
    with (gzip.open(args.real_file, "rt") if args.real_file.endswith(".gz") else open(args.real_file)) as f:
        for line in f:
            row = json.loads(line)
            control = [p["samples"] for p in row["procs"] if p["side"] == "control"]
            treatment = [p["samples"] for p in row["procs"] if p["side"] != "control"]
            walls = {"control": [], "treatment": []}
            for p in row["procs"]:
                walls["control" if p["side"] == "control" else "treatment"].append(p["wall_s"])
            pair_s = [a + b for a, b in zip(walls["control"], walls["treatment"], strict=False)]
            by_tag.setdefault(row["tag"], []).append(Trial(control, treatment, pair_s))
            loads.append(row["load"])
    # each trial is replayed up to its own length (a trial recorded with --until-decided
    # ends where the live rule stopped, so the replay reproduces that run's verdict)
    pairs = max(len(t.control) for ts in by_tag.values() for t in ts)
    budget = Budget(start=12, step=6, most=pairs, max_seconds=args.budget_s)
    # Lan-DeMets needs its horizon fixed in advance: the shortest recorded trial (a trial recorded
    # --until-decided ends where abwatch's rule stopped, which must not set the other rule's horizon)
    shortest = min(len(t.control) for ts in by_tag.values() for t in ts)
    print(pooled_windows_table(by_tag, 12))
    by_effect = {0.0 if tag == "same" else float(tag[4:]): judge(trials, args.seed, budget, sizes=(6, 12),
                                                                 ld_horizon=shortest)
                 for tag, trials in sorted(by_tag.items(), key=lambda kv: 0 if kv[0] == "same" else float(kv[0][4:]))}
    print(table(f"Real trials from {args.real_file} (C loop, ~2 ms a sample; load average "
                f"{np.mean(loads):.1f} on 2 cores)", by_effect))
    print(verdict_table(by_effect, budget))
    # the true change of a real build is its work ratio's effect on time, estimated from all
    # trials of that build pooled (thousands of pairs), not the nominal +x %
    truth = {e: float(np.median([d.change_pct for d in rows[CS]
                                 if d.change_pct is not None])) for e, rows in by_effect.items()}
    print(coverage_table("Real trials: interval coverage (truth: the median estimate over all trials of that build)",
                         by_effect, truth=lambda e: truth[e]))


def pooled_windows_table(by_tag: dict[str, list[Trial]], k: int) -> str:
    """Markdown: the pooled rules on every window of ``k`` consecutive pairs of the real trials
    (a long A/A trial gives several), 5k samples a side: more trials for the pooled figures."""
    windows = {tag: [Trial(t.control[s:s + k], t.treatment[s:s + k]) for t in ts
                     for s in range(0, min(len(t.control), len(t.treatment)) - k + 1, k)]
               for tag, ts in by_tag.items()}
    tags = sorted(windows, key=lambda tag: 0 if tag == "same" else float(tag[4:]))
    head = ["rule @" + str(5 * k)] + [("A/A false pos." if tag == "same" else f"+{tag[4:]}%") for tag in tags]
    lines = [f"#### Pooled rules on windows of {k} consecutive pairs of the real trials", "",
             "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    judges = {POOLED: lambda t: rules.abwatch(t, Budget(start=k), groups=False), HL: lambda t: rules.hodges_lehmann(t, k)}
    judges.update({name: (lambda t, rule=rule: rule(t, k)) for name, rule in ANCHORS.items()})
    for name, rule in judges.items():
        cells = [name]
        for tag in tags:
            calls = [rule(t).call for t in windows[tag]]
            cells.append(rules.rate(calls, 0 if tag == "same" else 1))
        lines.append("| " + " | ".join(cells) + " |")
    counts = ", ".join(f"{'A/A' if tag == 'same' else '+' + tag[4:] + '%'} {len(windows[tag])}" for tag in tags)
    return "\n".join(lines + ["", f"Windows: {counts}.", ""])


def verdict_table(by_effect: dict[float, dict[str, list[Decision]]], budget: Budget) -> str:
    """Markdown: abwatch's verdicts, time to a verdict and pairs used, per change."""
    lines = ["| change | same | regression | improvement | unknown | median s to verdict | "
             "median pairs | stop: decided / time / pairs exhausted |", "|---|---|---|---|---|---|---|---|"]
    for effect, rows in by_effect.items():
        ds = rows[CS]
        count = {v: sum(d.verdict == v for d in ds) for v in ("same", "regression", "improvement", "unknown")}
        decided = sum(d.verdict != "unknown" for d in ds)
        timed = sum(d.verdict == "unknown" and d.elapsed_s + d.elapsed_s / max(d.samples / 5, 1) > budget.max_seconds
                    for d in ds)
        lines.append(f"| +{effect:g}% | " + " | ".join(f"{count[v]}/{len(ds)}" for v in count)
                     + f" | {np.median([d.elapsed_s for d in ds]):.1f} | {np.median([d.samples / 5 for d in ds]):.0f}"
                     + f" | {decided} / {timed} / {len(ds) - decided - timed} |")
    return "\n".join(lines + [""])


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.detector", description=__doc__.split("\n\n")[0])
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--sim-trials", type=int, default=400, help="simulated A/A trials per shape")
    parser.add_argument("--sim-effect-trials", type=int, default=150)
    parser.add_argument("--real-trials", type=int, default=400, help="real A/A trials")
    parser.add_argument("--real-effect-trials", type=int, default=60)
    parser.add_argument("--real-layout-trials", type=int, default=60)
    parser.add_argument("--skip-real", action="store_true")
    parser.add_argument("--real-file", help="judge the trials saved there by benchmarks.detector.collect")
    parser.add_argument("--budget-s", type=float, default=120.0, help="time budget per workload (real file)")
    parser.add_argument("--skip-sim", action="store_true")
    args = parser.parse_args()
    print(f"Budget: first look {BUDGET.start} processes a side, +{BUDGET.step} per look, at most "
          f"{BUDGET.most} ({BUDGET.looks} looks); 5 samples a process.\n")
    if not args.skip_sim:
        simulation(args)
    if args.real_file:
        real_file(args)
    elif not args.skip_real:
        real(args)


if __name__ == "__main__":
    main()
