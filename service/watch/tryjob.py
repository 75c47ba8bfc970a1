"""On-demand verification (a "try" job, as Pinpoint calls it): a person who suspects a commit
asks the watch's devices to compare it, without a shell on them.

``abwatch try`` and ``POST /api/jobs`` queue a ``try`` job for one device (:func:`submit`); that
device's workers run it (:func:`run_try`) through :func:`~service.compare.driver.run_compare`,
the one path of every comparison, and verify a regression it finds when asked. The job's row
(``GET /api/jobs/{id}``, ``abwatch status``; :func:`service.read.serialize.job_json`) says
where it is and, once done, names its runs.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field

from sqlalchemy.orm import Session

from abwatch.core.errors import UsageError
from abwatch.builders import make_builder, sandbox
from abwatch.service.compare import driver, verify
from abwatch.service.compare.outcome import NothingToVerify
from abwatch.service.config import Config
from abwatch.service.store.models import Job
from abwatch.service.watch import queue
from abwatch.service.watch.device_config import device_names, for_device

KIND = "try"


class TryError(UsageError):
    """A try request that cannot be queued (unknown device, workload or ref)."""


@dataclass(frozen=True)
class TryRequest:
    """What a person asks: compare ``treatment`` with ``control`` on ``device``."""

    device: str
    control: str
    treatment: str
    workloads: list[str] = field(default_factory=list)  # default: all of the config's
    verify: bool = False
    who: str = ""


def submit(session: Session, config: Config, request: TryRequest) -> Job:
    """Check the request against the config and the repository, then queue its job.

    Refs are resolved now and the job keeps the shas: a branch that moves before a worker is
    free does not change what was asked. Every request is a job of its own.
    """
    devices = device_names(config)
    if request.device not in devices:
        raise TryError(f"device {request.device!r} is not one this config's watch runs on "
                       f"({', '.join(devices)})")
    names = {w.name for w in config.workloads}
    unknown = sorted(set(request.workloads) - names)
    if unknown:
        raise TryError(f"unknown workload(s) {', '.join(unknown)} (the config has: {', '.join(sorted(names))})")
    builder = make_builder(config)
    control, treatment = builder.resolve(request.control), builder.resolve(request.treatment)
    payload = {"control": control.sha, "treatment": treatment.sha, "control_ref": request.control,
               "treatment_ref": request.treatment, "workloads": sorted(request.workloads),
               "verify": request.verify, "who": request.who}
    job = queue.enqueue(session, KIND, request.device, payload, f"{KIND}:{uuid.uuid4()}")
    assert job is not None, "a fresh dedupe key never collides"
    session.commit()
    return job


def run_try(session: Session, config: Config, job: Job, progress: driver.Progress | None = None) -> dict:
    """The ``try`` job: the comparison, and its verification when asked and needed."""
    progress = progress or driver.NullProgress()
    p = job.payload
    # the treatment is code nobody merged: built apart from what the watch's builds reuse
    config = for_device(config, job.device)
    config = config.model_copy(update={"build": config.build.for_untrusted()})
    if p["workloads"]:
        config = config.model_copy(update={"workloads": [w for w in config.workloads if w.name in p["workloads"]]})
    # code nobody merged: no network for its builds and workloads, and no run at all without a sandbox
    with sandbox.untrusted():
        outcome = driver.run_compare(session, config, p["control"], p["treatment"], progress=progress)
        result = {"run_id": outcome.run_id, "status": outcome.status,
                  "verdicts": {r.workload: r.verdict.verdict.value for r in outcome.results}, "verify_run_id": None}
        if p["verify"] and any(r.regression_id for r in outcome.results):
            try:
                verified, _ = verify.run_verify(session, outcome.run_id, progress=progress)
                result["verify_run_id"] = verified.run_id
            except NothingToVerify as exc:  # another verify took them first
                result["verify_note"] = str(exc)
    return result
