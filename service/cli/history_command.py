"""``abwatch history``: one series of a workload (or of the builds) over commits, and where it
stepped: the command's work, apart from :mod:`.commands`, which dispatches to it."""

from __future__ import annotations

import argparse
import json

from rich.console import Console
from sqlalchemy.orm import Session

from abwatch.core.errors import UsageError
from abwatch.service.cli import report
from abwatch.service.compare.outcome import DriverError


def run(args: argparse.Namespace, session: Session, out: Console, err: Console) -> int:
    """``abwatch history WORKLOAD``: the workload's series (one repository and spec, one device
    fingerprint) on ``--metric``, its steps and the commits they start at; ``--metric binary-size``:
    the builds' own series."""
    # the read side loads NumPy and Otava: only when this command runs
    from abwatch.service.read import build_series, history

    if args.metric == "binary-size":  # the builds' own series, per build configuration
        return report.print_build_series(out, build_series.found(session, args.builder, args.config_hash), args.json)
    if not args.workload:
        raise UsageError(f"history --metric {args.metric} needs a workload")
    # One series only: a workload of this name in another repository, or with another spec, is another series.
    found = history.series_of(session, args.workload)
    chosen = next((w for w in found if w.id == args.series), None) if args.series else (found[0] if found else None)
    if args.series and chosen is None:
        raise DriverError(f"workload {args.workload!r} has no series {args.series}; its series: "
                          + (", ".join(str(w.id) for w in found) or "none"))
    if len(found) > 1 and chosen is not None:
        err.print(f"{args.workload}: {len(found)} series (repository, spec); showing {chosen.id}, choose with "
                  "--series: " + "; ".join(f"{w.id}: {w.repository.url} spec {w.spec_hash[:12]}" for w in found),
                  markup=False)
    series_id = chosen.id if chosen else None
    device_id, said = history.pick_device(session, args.workload, series_id, args.device, args.fingerprint)
    if said:
        err.print(said, markup=False)
    points = history.series(session, args.workload, args.device, series_id, args.metric, device_id)
    if not points:
        raise DriverError(f"no history for workload {args.workload!r}" + history.unknown_workload(session, args.workload)
                          + (f" on device {args.device!r}" if args.device else "")
                          + (f" on {args.metric} (it is recorded only where measured)" if args.metric != "time" else ""))
    skipped = 0
    line = None if args.all_branches else history.first_parent_line(session, args.workload, series_id)
    if line is not None:
        kept = history.on_line(points, line[1])
        skipped, points = len(points) - len(kept), kept
        if not points:
            raise DriverError(f"no measured commit of {args.workload!r} is on {line[0]}'s first-parent "
                                     "line; --all-branches shows them all")
    note = None
    try:
        steps = history.steps(points, max_pvalue=args.max_pvalue)
    except ImportError as exc:  # Apache Otava is installed apart: the series stands without its steps
        steps, note = [], str(exc)
        err.print(f"abwatch: no step changes: {note}", markup=False)
    if args.json:
        print(json.dumps({**report.history_json(args.workload, points, steps), "left_out": skipped, "note": note,
                          "metric": args.metric, "unit": history.UNITS[args.metric],
                          "series_id": series_id, "repository": chosen.repository.url if chosen else None,
                          "spec_hash": chosen.spec_hash if chosen else None, "device_id": device_id}))
        return 0
    report.print_history(out, args.workload, points, steps, skipped, history.UNITS[args.metric])
    return 0

