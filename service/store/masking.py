"""No secret is stored: every text a row is given passes :func:`abwatch.core.redact.mask_secrets`
before it is written (build logs, workload errors, run and job errors, JSON details).

A ``before_flush`` listener on every ORM session masks the string and JSON attributes of the
rows being inserted or updated, so a secret that reached a message by any path (a child's
output, an exception's text, a reply of a worker) is ``***`` in the database, whatever code
built the row. Rows written with Core ``insert()`` (samples, commits got-or-created) carry no
child output.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import event, inspect
from sqlalchemy.orm import Session

from abwatch.core.redact import mask_secrets, secret_values


def masked(value: Any) -> Any:
    """``value`` (a string, or JSON made of dicts, lists and strings) with secrets masked."""
    if isinstance(value, str):
        return mask_secrets(value)
    if isinstance(value, dict):
        return {masked(k): masked(v) for k, v in value.items()}
    if isinstance(value, list):
        return [masked(v) for v in value]
    return value


@event.listens_for(Session, "before_flush")
def _mask_rows(session: Session, _context, _instances) -> None:
    if not secret_values():  # nothing to mask in this process
        return
    for row in (*session.new, *session.dirty):
        state = inspect(row)
        for attr in state.mapper.column_attrs:
            value = state.dict.get(attr.key)
            if isinstance(value, (str, dict, list)):
                new = masked(value)
                if new != value:
                    setattr(row, attr.key, new)
