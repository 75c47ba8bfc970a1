"""The watch: poll a branch (:mod:`.poll`), pick controls (:mod:`.controls`), escalate and bisect
(:mod:`.bisect`), the job queue on PostgreSQL (:mod:`.queue`) and the long-running loop (:mod:`.daemon`).
"""
