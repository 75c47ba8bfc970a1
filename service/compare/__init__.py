"""One A/B comparison: build both sides (:mod:`.building`), measure them interleaved until
the statistics decide (:mod:`.driver`), time compiles (:mod:`.compile_time`), explain per operator
(:mod:`.attribution`), store runs and records, and move regressions through their states
(:mod:`.lifecycle`). :mod:`.outcome` holds what a comparison returns.
"""
