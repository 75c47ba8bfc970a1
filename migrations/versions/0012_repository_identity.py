"""One row per repository, stored without credentials: merge rows split by credentials.

Before this revision the watch and bisection stored `repo.url` as given (a password in it
included) while compare stored it masked, so one repository could have two rows
(`http://user:s3cret@host/x` and `http://user:***@host/x`) and its history split between
them. Every row is now stored under its masked URL (`abwatch.builders.redact.mask_url`, what
`service.store.rows.get_repository` stores from now on); rows with the same masked URL become one:
the oldest row already at the masked URL (else the oldest) keeps its id, the others' commits
and watch progress move to it (a commit or progress row it has already is merged into its own,
with every reference to the duplicate pointed at the survivor), and the duplicates go.

Revision ID: 0012
Revises: 0011
Create Date: 2026-11-24 00:20:00
"""
import json
import re
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

from alembic import op
import sqlalchemy as sa


revision = '0012'
down_revision = '0011'
branch_labels = None
depends_on = None

# abwatch.builders.redact.mask_url as it was when this revision was written (a copy, not an
# import: a migration must do the same thing whatever abwatch runs it).
MASK = '***'
_SECRET_PARAM = re.compile(r'token|key|secret|passw|pwd|auth|sig|credential', re.IGNORECASE)


def mask_url(url: str) -> str:
    """``url`` with its password (or a lone token in the user part, or a query parameter named
    like a credential) replaced by ``***``: a repository's stored identity, as of this revision."""
    try:
        parts = urlsplit(url)
    except ValueError:
        return url
    query = parse_qsl(parts.query, keep_blank_values=True) if parts.scheme not in ('', 'file') else []
    if any(_SECRET_PARAM.search(key) for key, _ in query):  # rewritten only then: the rest stays as given
        parts = parts._replace(query=urlencode(
            [(key, MASK if _SECRET_PARAM.search(key) else value) for key, value in query], safe='*'))
        url = urlunsplit(parts)
    if not parts.scheme or '@' not in parts.netloc or parts.scheme == 'file':
        return url
    userinfo, _, host = parts.netloc.rpartition('@')
    user, colon, _password = userinfo.partition(':')
    if colon:
        userinfo = f'{user}:{MASK}'
    elif parts.scheme in ('http', 'https'):  # a bare user part over HTTP is a token
        userinfo = MASK
    else:  # ssh://git@host: a user name, not a secret
        return url
    return urlunsplit(parts._replace(netloc=f'{userinfo}@{host}'))


# Rows of these tables belong to a repository; the columns that make one unique within it.
OWNED = {"commits": ("sha",), "watch_progress": ("branch", "device", "config_hash"),
         "workloads": ("name", "spec_hash"), "runs": ()}


def _references(bind, table: str) -> list[tuple[str, str]]:
    """(table, column) of every single-column foreign key to ``table.id``."""
    inspector = sa.inspect(bind)
    found = []
    for name in inspector.get_table_names():
        for fk in inspector.get_foreign_keys(name):
            if fk["referred_table"] == table and fk["referred_columns"] == ["id"] \
                    and len(fk["constrained_columns"]) == 1:
                found.append((name, fk["constrained_columns"][0]))
    return found


def _move(bind, table: str, key: tuple[str, ...], source: int, target: int) -> dict[int, int]:
    """Move ``table``'s rows of repository ``source`` to ``target``; {duplicate id: survivor id}
    for rows ``target`` has already (same ``key``), which stay behind to be merged."""
    merged = {}
    columns = ", ".join(("id",) + key)
    for row in bind.execute(sa.text(f"SELECT {columns} FROM {table} WHERE repository_id = :s"),
                            {"s": source}).mappings().all():
        where = " AND ".join(f"{c} = :{c}" for c in key) or "1 = 0"
        twin = bind.execute(sa.text(f"SELECT id FROM {table} WHERE repository_id = :t AND {where}"),
                            {"t": target, **{c: row[c] for c in key}}).scalar()
        if twin is None:
            bind.execute(sa.text(f"UPDATE {table} SET repository_id = :t WHERE id = :id"),
                         {"t": target, "id": row["id"]})
        else:
            merged[row["id"]] = twin
    return merged


def _repoint(bind, table: str, merged: dict[int, int]) -> None:
    """Point every reference to a duplicate row of ``table`` at its survivor, then delete it."""
    if not merged:
        return
    references = _references(bind, table)
    for duplicate, survivor in merged.items():
        for other, column in references:
            if (other, column) == ("watched_commits", "progress_id") or (other, column) == ("watched_commits",
                                                                                             "commit_id"):
                # unique (progress_id, commit_id): a commit the survivor took up already stays its own
                partner = "commit_id" if column == "progress_id" else "progress_id"
                bind.execute(sa.text(
                    f"DELETE FROM watched_commits WHERE {column} = :d AND {partner} IN "
                    f"(SELECT {partner} FROM watched_commits WHERE {column} = :s)"),
                    {"d": duplicate, "s": survivor})
            bind.execute(sa.text(f"UPDATE {other} SET {column} = :s WHERE {column} = :d"),
                         {"s": survivor, "d": duplicate})
        bind.execute(sa.text(f"DELETE FROM {table} WHERE id = :d"), {"d": duplicate})


def _repoint_jobs(bind, merged: dict[int, int]) -> None:
    """Queued ``test`` jobs name their watch progress row in their JSON payload."""
    if not merged:
        return
    for job_id, payload in bind.execute(sa.text("SELECT id, payload FROM jobs")).all():
        data = json.loads(payload) if isinstance(payload, str) else payload
        if isinstance(data, dict) and data.get("progress_id") in merged:
            data["progress_id"] = merged[data["progress_id"]]
            bind.execute(sa.text("UPDATE jobs SET payload = :p WHERE id = :id"),
                         {"p": json.dumps(data), "id": job_id})


def upgrade() -> None:
    bind = op.get_bind()
    groups: dict[str, list[tuple[int, str]]] = {}
    for row_id, url in bind.execute(sa.text("SELECT id, url FROM repositories ORDER BY id")).all():
        groups.setdefault(mask_url(url), []).append((row_id, url))
    for identity, rows in groups.items():
        survivor = next((row_id for row_id, url in rows if url == identity), rows[0][0])
        for row_id, _ in rows:
            if row_id == survivor:
                continue
            for table, key in OWNED.items():
                merged = _move(bind, table, key, row_id, survivor)
                if table == "watch_progress":
                    _repoint_jobs(bind, merged)
                _repoint(bind, table, merged)
            bind.execute(sa.text("DELETE FROM repositories WHERE id = :id"), {"id": row_id})
        bind.execute(sa.text("UPDATE repositories SET url = :u WHERE id = :id"), {"u": identity, "id": survivor})


def downgrade() -> None:
    pass  # the credentials are gone for good; merged rows stay merged
