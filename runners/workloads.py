"""Workload kinds, registered by name in :data:`WORKLOAD_KINDS` (as builders are in ``BUILDERS``
and runners in ``RUNNERS``).

A new kind of workload is one module, a :class:`~abwatch.runners.workload_kind.WorkloadKind`
subclass with its config model, and its entry here. The config validates each
``[[workloads]]`` entry with the model its kind names (:data:`WorkloadConfig`); the config's
path resolution and checks, the runners, the compile-time and instruction measurements, the
records and the driver's output check ask the registry, never ``kind ==``.
"""

from __future__ import annotations

from typing import Annotated

from pydantic import PlainValidator, SerializeAsAny

from abwatch.builders.workload_spec import WorkloadSpec
from abwatch.core.config_base import kind_validator
from abwatch.core.plugins import Registry
from abwatch.runners.command_workload import CommandKind
from abwatch.runners.tvm_workload import TvmKind
from abwatch.runners.workload_kind import WorkloadKind

DEFAULT_KIND = "command"  # a [[workloads]] entry without ``kind`` (configs from before kinds stay valid)

WORKLOAD_KINDS: Registry[WorkloadKind] = Registry(
    "workload kind", ((kind.kind, kind) for kind in (CommandKind(), TvmKind())), config=lambda kind: kind.config)

# A ``[[workloads]]`` entry validated by the model of the kind it names in WORKLOAD_KINDS (read
# when it is validated, so a kind registered later counts); an instance of a registered kind's
# model is taken as it is. Errors keep their place (``workloads[0].command: ...``).
validate_workload = kind_validator(WORKLOAD_KINDS, DEFAULT_KIND, "workload")

# A workload of any registered kind: validated by its kind's model, dumped with all of that
# model's fields (the watch's identity and a run's stored config hash them).
WorkloadConfig = Annotated[SerializeAsAny[WorkloadSpec], PlainValidator(validate_workload)]
