"""The database: typed tables (:mod:`.models`), engines, sessions and migrations (:mod:`.db`),
get-or-create rows (:mod:`.rows`) and PostgreSQL advisory locks (:mod:`.locks`).
"""
