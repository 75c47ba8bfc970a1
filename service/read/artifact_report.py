"""What ``abwatch cache`` and the build page say of the shared artifact store (``[artifacts]
store``): whether it answers now, which local entries it holds (their manifests in the
database), and, for one build, where its artifact was pushed and by which host."""

from __future__ import annotations

from typing import Any

from sqlalchemy import func, select
from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.orm import Session, defer

from abwatch.core.redact import mask_secrets
from abwatch.builders.artifact_store import ArtifactStore
from abwatch.service.config import Config
from abwatch.service.store import db
from abwatch.service.store.artifacts import ArtifactManifest

# the file list of a TVM build holds thousands of entries: a page or a listing needs none of it
SUMMARY = defer(ArtifactManifest.manifest)


def manifest_json(row: ArtifactManifest) -> dict[str, Any]:
    """An artifact's manifest row, without its file list: the store, its objects and bytes, the
    host that pushed it and when, and the build it came from."""
    return {"store": row.store, "objects": row.objects, "size_bytes": row.size_bytes, "host": row.host,
            "build_id": row.build_id, "pushed_at": row.updated_at.isoformat() if row.updated_at else None}


def manifest_of(session: Session, artifact_key: str | None) -> dict[str, Any] | None:
    """The manifest of ``artifact_key`` (:func:`manifest_json`), or None when it is not in the store."""
    if artifact_key is None:
        return None
    row = session.scalars(select(ArtifactManifest).options(SUMMARY).where(ArtifactManifest.artifact_key == artifact_key)).first()
    return manifest_json(row) if row is not None else None


def store_report(config: Config, database_url: str, keys: list[str]) -> dict[str, Any] | None:
    """``abwatch cache``'s store part (None without ``[artifacts] store``): ``store`` (its URL as
    shown), ``reachable`` and ``problem`` (a request now), ``shared`` (each of ``keys``, the local
    entries, that has a manifest: key -> :func:`manifest_json`), ``manifests`` (how many the
    database holds) and ``note`` (why the database could not say)."""
    store = ArtifactStore.from_config(config.artifacts, need_key=False)  # reads what it holds: no key needed
    if store is None:
        return None
    problem = store.reach()
    report: dict[str, Any] = {"store": store.display, "reachable": problem is None, "problem": problem,
                              "shared": {}, "manifests": None, "note": None}
    try:
        report["note"] = db.missing_database(database_url)
        if report["note"]:
            return report
        engine = db.open_database(database_url, write=False)
        try:
            with db.session_scope(engine) as session:
                rows = session.scalars(select(ArtifactManifest).options(SUMMARY).where(ArtifactManifest.artifact_key.in_(keys)))
                report["shared"] = {row.artifact_key: manifest_json(row) for row in rows}
                report["manifests"] = session.scalar(select(func.count()).select_from(ArtifactManifest))
        finally:
            engine.dispose()
    except (SQLAlchemyError, db.DatabaseUrlError, db.SchemaError) as exc:
        report["note"] = mask_secrets(f"manifests not read: {str(exc).splitlines()[0]}")
    return report
