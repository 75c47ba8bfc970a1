"""The HTTP API (:mod:`.api`) and the dashboard pages (:mod:`.dashboard`, ``templates/``, ``static/``).
"""
