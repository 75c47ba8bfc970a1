"""The read side shared by the CLI, the API, the dashboard and alerts: queries over stored
runs and regressions (:mod:`.queries`), a stored run as an outcome again (:mod:`.stored`),
history series (:mod:`.history`) and triage (:mod:`.triage`).
"""
