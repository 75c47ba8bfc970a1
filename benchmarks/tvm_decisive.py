"""How decisive abwatch is on TVM run time, per workload and mode, quiet and beside busy loops.

    python -m benchmarks.tvm_decisive --cache .abwatch/cache [--runs 20] [--busy 0,6]
        [--workloads mlp,cnn,matmul,attention,llm] [--truths aa,plus3] [--modes fresh,forked,forked-waiting,duet,duet-forked,learnt,duet-learnt,
        duet1-forked,duet1-learnt]
        [--max-seconds 300] [--out rows.jsonl] [--taught mlp=5/2,...] [--loops-in shared|own]
        [--threshold-pct 0.1]

Each run is one ``abwatch compare`` of one workload of one TVM release against itself (a
subprocess, its own SQLite database, one thread a measured process): ``aa`` the same workload
on both sides, ``plus3`` the treatment's workload about 3 % larger through
``treatment_options`` (an outer dimension of each model below). The modes, run
side by side (their order rotated every run): ``fresh`` (the default until 2026-11-30: a fresh TVM worker a
process, the two sides one after the other), ``forked`` (``[runner] processes = "forked"``: children
of a fork server, each server's successor started ahead), ``forked-waiting`` (the same, each server
started when its first child is asked for: ``servers_ahead = false``), ``duet`` (``[run]
schedule = "duet"``: the two sides at once, each pinned to its own CPU, fresh workers),
``duet-forked`` (the combination: a duet of forked children, each pinning itself), ``learnt`` (forked, with
the samples a process and children a fork server that the workload's own A/A runs on this
host taught abwatch's noise history: what a watch's later runs of a workload take; see
:func:`learn`) and ``duet-learnt`` (a duet of forked children at those counts); ``duet1-forked`` and
``duet1-learnt``: the same on one CPU (``schedule = "duet-one-cpu"``). Every look's interval is read
from the report as it is printed, timed from the start of the command, so one run with a
``--max-seconds`` budget gives the interval's width at 60, 120 and 300 s (a run decided sooner
keeps its final width). Busy loops (``python3 -c "while 1: pass"``) are started for a load
level and stopped after it. Prints one Markdown row per (load, workload, truth, mode): the
verdicts, the median seconds to the verdict, the median width at each mark, the median pairs a
minute (over the whole run, its compiling pair and first servers too: a run decided at its first
look shows few; ``--threshold-pct 0.1`` keeps every run to its budget, a throughput figure).
``--taught WORKLOAD=SAMPLES/CHILDREN`` gives a workload's learnt counts (those an
earlier teaching run printed) instead of teaching them again. ``--loops-in own`` starts each busy
loop in a session of its own (``shared``, the default: the benchmark's session; see
:func:`benchmarks.load.busy_loops` for why the two load a host differently). Nothing here runs in CI.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import re
import shutil
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter, defaultdict
from pathlib import Path

from benchmarks.load import busy_loops

VERSION = "0.27.0.post1"
MARKS = (60, 120, 300)
# A small single-head attention whose query rows are an option (config/workloads' script has
# fixed shapes): 132 queries to 128 keys is +3.1 % of the rows of both matmuls and the softmax.
ATTENTION = '''
from tvm import relax
from tvm.relax.frontend import nn


def workload(tokens=128, dim=64, queries=128):
    class Attention(nn.Module):
        def forward(self, q, k, v):
            scores = nn.op.matmul(q, nn.op.permute_dims(k, [1, 0])) * (dim ** -0.5)
            return nn.op.matmul(nn.op.softmax(scores, axis=-1), v)

    spec = {"forward": {"q": nn.spec.Tensor((queries, dim), "float32"),
                        "k": nn.spec.Tensor((tokens, dim), "float32"),
                        "v": nn.spec.Tensor((tokens, dim), "float32")}}
    mod, _ = Attention().export_tvm(spec)
    return mod
'''
# (model lines, the treatment's overrides for about +3 % of the work). Each made change grows
# an outer dimension only (rows of a batch, of a matrix, queries, decode steps): the kernels'
# inner loops, strides and vectorisation stay the control's. Changing an inner dimension is no
# truth: on the 16-core device host, matmul n 128 -> 132 measured 13-23 % *faster* and MLP
# hidden 512 -> 521 30 % faster (power-of-two rows alias in the cache; docs/statistics.md).
WORKLOADS = {
    # fc 256->512->512->10 on a batch of 128, 20 samples a process (a call is 128 times the
    # quickstart's batch of 1): 132 rows are +3.1 % of every layer's work, in whole groups of 4
    # rows as the matmul's m = 132 (a batch of 33 to 32 measured +5.1..+6.6 %: the odd row costs
    # more than its share). At batch 1 no option scales it: its time is not proportional to its
    # multiply-adds (33 classes to 10 measured +1.1 %, 74 classes +7.0 %), and hidden 521 (an
    # inner dimension) measured -30 % on one CPU
    "mlp": ('model = "builtin:mlp"\ninput_shape = [128, 256]\nsamples = 20\n', {"input_shape": [132, 256]}),
    # the CNN's convolutions are fixed by the input (a batch of 33 would be 33 times the work
    # of the quickstart's); its last layer's outputs (64 inputs each) are the outer dimension
    # there: 1324 classes to 10 add 84 k multiply-adds to 2.80 M, +3.0 %
    "cnn": ('model = "builtin:cnn"\ninput_shape = [1, 3, 32, 32]\n', {"options": {"classes": 1324}}),
    # 128x128x128 against m = 132 rows: +3.1 %
    "matmul": ('model = "te:matmul"\noptions = {m = 128, k = 128, n = 128}\n', {"options": {"m": 132}}),
    "attention": ('model = "script:{script}"\n', {"options": {"queries": 132}}),
    # one more decode step in 32 (+3.1 % of the decode; the prefill of 32 tokens is unchanged, so
    # the whole generation grows by less); hidden 130 in two heads measured 32 % faster than 128
    "llm": ('model = "builtin:llm-decode"\nmeasure = ["time"]\noptions = {heads = 2, decode_steps = 32}\n',
            {"options": {"decode_steps": 33}}),
}
MODES = {
    "fresh": 'processes = "fresh"\n',
    "forked": 'processes = "forked"\n',
    "forked-waiting": 'processes = "forked"\nservers_ahead = false\n',
    "duet": 'processes = "fresh"\n',
    "duet-forked": 'processes = "forked"\n',
    "duet-learnt": 'processes = "forked"\n',
    "learnt": 'processes = "forked"\n',
    "duet1-forked": 'processes = "forked"\n',
    "duet1-learnt": 'processes = "forked"\n',
}
SCHEDULES = {"duet": "duet", "duet1": "duet-one-cpu"}  # a mode's first word: its run.schedule
TEACHING_RUNS = 3  # A/A runs a workload is given to teach its repetitions (any trusted run's verdict teaches)
TEACHING_SECONDS = 300.0  # at least, a teaching run's budget: at a busy host's load 120 s may end `unknown`
CONFIG = """cache_dir = {cache}
[build]
kind = "tvm-wheel"
[runner]
kind = "cpu"
threads = 1
{runner}[run]
max_seconds = {max_seconds}
compile_repetitions = 0
{run}{stats}[[workloads]]
name = "w"
kind = "tvm"
{model}{treatment}"""
LOOK = re.compile(r"look \d+: .*?\(CI (-?[\d.]+)\.\.(-?[\d.]+)%")


def _toml(value) -> str:
    """``value`` (a dict of numbers, lists and dicts) as an inline TOML value."""
    if isinstance(value, dict):
        return "{" + ", ".join(f"{k} = {_toml(v)}" for k, v in value.items()) + "}"
    return json.dumps(value)


def config_text(args, workload: str, truth: str, mode: str, script: Path, learnt: dict | None = None) -> str:
    """The config of one run. ``learnt`` (the learnt mode): the workload's ``samples`` and
    ``children_per_server`` as its A/A runs taught them; ``{}``: a teaching run, with no count
    set (only a run on the default count learns one); None: the workload's own, as in every
    other mode (a learnt run of a workload none of whose teaching runs taught anything)."""
    model, plus3 = WORKLOADS[workload]
    treatment = ""
    if learnt is not None:
        if not learnt or learnt.get("samples") is not None:  # the learnt count replaces the workload's own
            model = re.sub(r"(?m)^samples = \d+\n", "", model)
        treatment = "".join(f"{key} = {value}\n" for key, value in learnt.items() if value is not None)
    if truth == "plus3":
        treatment += f"treatment_options = {_toml(plus3)}\n"
    return CONFIG.format(cache=json.dumps(str(args.cache.resolve())), runner=MODES[mode],
                         run=(f'schedule = "{SCHEDULES[first]}"\n' if (first := mode.split("-")[0]) in SCHEDULES else ""), max_seconds=args.max_seconds,
                         stats=f"[stats]\nthreshold_pct = {args.threshold_pct:g}\n" if args.threshold_pct is not None else "",
                         model=model.replace("{script}", str(script)), treatment=treatment)


def learn(args, workload: str, work: Path, busy: int) -> dict | None:
    """The samples a process and children a fork server the workload's forked A/A runs teach
    abwatch's noise history on this host (at most :data:`TEACHING_RUNS` runs, until one teaches:
    every run whatever its verdict, where its processes were enough to choose from), for every
    later run of the learnt mode; a count none taught is the workload's own (None). The teaching
    runs are not rows of the table."""
    # a history of its own a load level: a profile pools its runs (the servers' share)
    database = work / f"{workload}-teaching-{busy}.db"
    # abwatch's own threshold: a teaching run ends when its verdict does, as a watch's would
    teaching = argparse.Namespace(**{**vars(args), "max_seconds": max(args.max_seconds, TEACHING_SECONDS),
                                     "threshold_pct": None})
    for _ in range(TEACHING_RUNS):
        found = one(teaching, workload, "aa", "learnt", work, learnt={}, database=database)
        with sqlite3.connect(database) as db:
            taught = db.execute("SELECT samples, children FROM noise_profiles").fetchone()
        print(json.dumps({"teaching": workload, "verdict": found["verdict"], "learnt": taught}),
              file=sys.stderr, flush=True)
        if taught is not None and taught != (None, None):
            return {"samples": taught[0], "children_per_server": taught[1]}
    return None


def one(args, workload: str, truth: str, mode: str, work: Path, learnt: dict | None = None,
        database: Path | None = None) -> dict:
    """One ``abwatch compare`` and its figures (``database``: kept between runs; default a new one)."""
    config = work / f"{workload}-{truth}-{mode}.toml"
    config.write_text(config_text(args, workload, truth, mode, work / "attention.py", learnt))
    if database is None:
        database = work / f"{workload}-{truth}-{mode}.db"
        database.unlink(missing_ok=True)
    report = work / f"{workload}-{truth}-{mode}.json"
    looks: list[tuple[float, float]] = []  # (seconds since the command started, interval width in points)
    started = time.monotonic()
    # the report to a file: a long one cannot then fill a pipe while the looks are read from stderr
    with report.open("w") as out:
        proc = subprocess.Popen([sys.executable, "-m", "abwatch.service.cli.main", "compare", "--config",
                                 str(config), "--control", VERSION, "--treatment", VERSION, "--json",
                                 "--db", f"sqlite:///{database}"], stdout=out, stderr=subprocess.PIPE, text=True)
        assert proc.stderr is not None
        tail: list[str] = []
        for line in proc.stderr:  # the looks, timed as they are printed
            tail = [*tail[-19:], line]
            if m := LOOK.search(line):
                looks.append((time.monotonic() - started, float(m.group(2)) - float(m.group(1))))
        proc.wait()
    try:
        (result,) = json.loads(report.read_text())["results"]
    except (ValueError, KeyError):  # the command failed before its report: a row that says how, not a lost campaign
        return {"workload": workload, "truth": truth, "mode": mode, "verdict": "failed", "change_pct": None,
                "ci_pct": None, "seconds": time.monotonic() - started, "pairs": 0, "pairs_per_min": None,
                "widths": dict.fromkeys(MARKS), "unit": None,
                "failure": f"exit {proc.returncode}: {''.join(tail)[-2000:]}", "load": os.getloadavg()[0]}
    low, high = result["ci_pct"] or (None, None)
    if low is not None:  # the verdict's interval, from the moment the command ended
        looks.append((time.monotonic() - started, high - low))
    # the width at each mark: the last look's before it (none yet: no interval to show)
    # (a mark past the budget has none: the run could not go on to it)
    widths = {mark: next((w for t, w in reversed(looks) if t <= mark), None) if mark <= args.max_seconds else None
              for mark in MARKS}
    counted = re.search(r"(\d+) pairs", result.get("stop_reason") or "")
    pairs = int(counted.group(1)) if counted else 0
    return {"workload": workload, "truth": truth, "mode": mode, "verdict": result["verdict"],
            "change_pct": result["change_pct"], "ci_pct": result["ci_pct"], "seconds": result["elapsed_s"],
            "pairs": pairs, "pairs_per_min": 60 * pairs / result["elapsed_s"] if result["elapsed_s"] else None,
            "widths": widths, "unit": result.get("unit"), "failure": result.get("failure"),
            "load": os.getloadavg()[0], "learnt": learnt}


def _taught(text: str) -> dict[str, dict]:
    """``--taught``'s counts by workload (``mlp=5/2``: 5 samples a process, 2 children a server)."""
    given = {}
    for item in filter(None, text.split(",")):
        try:
            name, counts = item.split("=")
            samples, children = (int(x) for x in counts.split("/"))
        except ValueError:
            raise SystemExit(f"--taught: {item!r} is not WORKLOAD=SAMPLES/CHILDREN") from None
        if name not in WORKLOADS:
            raise SystemExit(f"--taught: unknown workload {name!r}; known: {', '.join(WORKLOADS)}")
        given[name] = {"samples": samples, "children_per_server": children}
    return given


def row(found: list[dict]) -> str:
    """A table row's figures."""
    def median(values):
        values = [v for v in values if v is not None]
        return f"{statistics.median(values):.1f}" if values else "-"
    counts = Counter(r["verdict"] for r in found)
    return (f"{', '.join(f'{k} {n}' for k, n in sorted(counts.items()))} | {median(r['seconds'] for r in found)} | "
            + " | ".join(median(r["widths"][m] for r in found) for m in MARKS)
            + f" | {median(r['pairs_per_min'] for r in found)}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cache", type=Path, default=Path(".abwatch/cache"),
                        help="cache_dir holding (or receiving) the TVM wheel venvs (default: the quickstart's)")
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--busy", default="0,6", help="the load levels: busy loops beside the runs, comma-separated")
    parser.add_argument("--workloads", default=",".join(WORKLOADS))
    parser.add_argument("--truths", default="aa,plus3")
    parser.add_argument("--modes", default=",".join(MODES))
    parser.add_argument("--max-seconds", type=float, default=300.0)
    parser.add_argument("--out", type=Path, help="JSON lines, one a comparison")
    parser.add_argument("--taught", default="", help="learnt counts given, not taught: WORKLOAD=SAMPLES/CHILDREN,...")
    parser.add_argument("--threshold-pct", type=float,
                        help="stats.threshold_pct (default abwatch's): a small one (0.1) keeps every run to its "
                             "budget, so its pairs a minute are its whole budget's (a throughput figure)")
    parser.add_argument("--loops-in", choices=("shared", "own"), default="shared",
                        help="the busy loops' sessions: the benchmark's (shared) or one each (own)")
    parser.add_argument("--keep", type=Path, help="a folder to keep each run's database in (a row's stored "
                                                  "processes and samples, for replays such as cpu_figures)")
    args = parser.parse_args()
    given = _taught(args.taught)
    workloads, truths, modes = (args.workloads.split(","), args.truths.split(","), args.modes.split(","))
    for name, known in ((workloads, WORKLOADS), (modes, MODES), (truths, ("aa", "plus3"))):
        if unknown := set(name) - set(known):
            raise SystemExit(f"unknown {sorted(unknown)}; known: {', '.join(known)}")
    rows: dict[tuple, list[dict]] = defaultdict(list)
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        work.chmod(0o755)  # measured processes run sandboxed as an unprivileged user, who reads the config here
        (work / "attention.py").write_text(ATTENTION)
        for busy in (int(b) for b in args.busy.split(",")):
            with busy_loops(busy, own_sessions=args.loops_in == "own"):
                # what each workload's learnt runs take, taught at this load (where not given)
                taught = ({w: given[w] if w in given else learn(args, w, work, busy) for w in workloads}
                          if any(m.endswith("learnt") for m in modes) else {})
                # the modes side by side, their order rotated every run
                for run, workload, truth, k in itertools.product(range(args.runs), workloads, truths,
                                                                  range(len(modes))):
                    mode = modes[(run + k) % len(modes)]
                    learnt = taught[workload] if mode.endswith("learnt") else None
                    found = {**one(args, workload, truth, mode, work, learnt), "busy": busy, "run": run,
                             "loops_in": args.loops_in, "threshold_pct": args.threshold_pct}
                    rows[(busy, workload, truth, mode)].append(found)
                    if args.keep:
                        args.keep.mkdir(parents=True, exist_ok=True)
                        shutil.copyfile(work / f"{workload}-{truth}-{mode}.db",
                                        args.keep / f"{workload}-{truth}-{mode}-{busy}-{run}.db")
                    print(json.dumps(found), file=sys.stderr, flush=True)
                    if args.out:
                        with args.out.open("a") as out:
                            out.write(json.dumps(found) + "\n")
    print(f"\nTVM {VERSION} against itself, one thread a process, run.max_seconds = {args.max_seconds:g}, "
          f"{args.runs} runs a row, busy loops in {'a session each' if args.loops_in == 'own' else 'one session'}")
    print("| busy loops | workload | truth | mode | verdicts | median s to verdict | "
          + " | ".join(f"width at {m} s (pp)" for m in MARKS) + " | pairs/min |")
    print("|---:|---|---|---|---|---:|" + "---:|" * len(MARKS) + "---:|")
    for (busy, workload, truth, mode), measured in rows.items():
        print(f"| {busy} | {workload} | {truth} | {mode} | {row(measured)} |")


if __name__ == "__main__":
    main()
