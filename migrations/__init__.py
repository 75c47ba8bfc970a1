"""Alembic migrations: the only way abwatch's schema is created or changed."""
