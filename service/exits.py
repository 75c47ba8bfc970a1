"""The exit codes of every ``abwatch`` command and what each means (README, "Operations";
``abwatch --help`` lists them from here). Plain constants: the parser imports this."""

EXIT_OK = 0
EXIT_REGRESSION = 1
EXIT_USAGE = 2
EXIT_BUILD_FAILED = 3
EXIT_INCOMPLETE = 4  # a workload could not be judged (crashed, hung, no valid sample); a watch job failed
EXIT_INTERNAL = 5  # an unexpected error: database unreachable, disk full, a bug
EXIT_INTERRUPTED = 130  # SIGINT or SIGTERM; the run is marked interrupted

MEANINGS = {
    EXIT_OK: "no regression (or nothing to do)",
    EXIT_REGRESSION: "a regression found (compare) or confirmed (verify, watch --once)",
    EXIT_USAGE: "usage or config error (the message names the file, key or ref)",
    EXIT_BUILD_FAILED: "a build failed",
    EXIT_INCOMPLETE: "incomplete: a workload could not be judged, or a job of a watch pass failed",
    EXIT_INTERNAL: "internal error (database unreachable, disk full, a bug)",
    EXIT_INTERRUPTED: "interrupted by SIGINT or SIGTERM",
}
