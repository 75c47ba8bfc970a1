"""Small get-or-create helpers that keep one row per repository, commit, device, workload."""

from __future__ import annotations

from sqlalchemy import select
from sqlalchemy.orm import Session

from service.models import Commit, Device, Repository, Workload
from service.repo import CommitInfo


def get_repository(session: Session, url: str) -> Repository:
    """The row of the repository at ``url``, created on first sight."""
    row = session.scalar(select(Repository).where(Repository.url == url))
    if row is None:
        row = Repository(url=url)
        session.add(row)
        session.flush()
    return row


def get_commit(session: Session, repository: Repository, info: CommitInfo) -> Commit:
    """The row of commit ``info.sha`` in ``repository``, created on first sight."""
    row = session.scalar(
        select(Commit).where(Commit.repository_id == repository.id, Commit.sha == info.sha)
    )
    if row is None:
        row = Commit(
            repository_id=repository.id, sha=info.sha, summary=info.summary,
            author=info.author, committed_at=info.committed_at,
        )
        session.add(row)
        session.flush()
    return row


def get_device(session: Session, description: dict) -> Device:
    """The row of the device a runner described; its hardware description is refreshed."""
    row = session.scalar(select(Device).where(Device.name == description["name"]))
    if row is None:
        row = Device(name=description["name"], kind=description["kind"])
        session.add(row)
    row.hardware_config = description.get("hardware_config", {})
    session.flush()
    return row


def get_workload(session: Session, name: str, kind: str, spec: dict) -> Workload:
    """The row of workload ``name``; its spec is refreshed to the config's current one."""
    row = session.scalar(select(Workload).where(Workload.name == name))
    if row is None:
        row = Workload(name=name, kind=kind)
        session.add(row)
    row.spec = spec
    session.flush()
    return row
