"""Plug-ins by name: one :class:`Registry` per kind of plug-in (builds, builders, runners,
workload kinds, device APIs, control rules), and the config validation that reads it.

A registry maps a name (what the config writes: ``kind = "tvm-source"``) to its entry (a
class, an object, a config model). Asking for a name it lacks raises :class:`UnknownName`,
whose message lists the known names and the nearest one. An entry may bring its own config
model (``config=`` says how to find it): :func:`abwatch.core.config_base.kind_validator` then validates a config section by
the model of the ``kind`` it names, so the config keeps no second list of names.

Where a plug-in's implementation cannot be imported by what validates its name (a builder
needs GitPython; the config parser must not load it), its name is registered low, with its
config model, and the implementation in a registry ``of`` that one: registering a name the
lower one lacks is refused, and :meth:`Registry.missing` lists the names still without one.
"""

from __future__ import annotations

import difflib
import enum
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any, Generic, TypeVar, overload

if TYPE_CHECKING:  # the registry itself needs no pydantic: `abwatch --version` loads it
    from pydantic import BaseModel

T = TypeVar("T")
D = TypeVar("D")
_ABSENT: Any = object()


class UnknownName(KeyError):
    """A name no entry of the registry has; the message lists those it has."""

    def __str__(self) -> str:  # a KeyError's str() is the repr of its argument
        return str(self.args[0])


class Registry(Generic[T]):
    """Entries by name, in the order they were registered.

    ``what`` names the plug-in in messages (``unknown builder 'x'; expected one of ...``);
    ``config`` gives an entry's config model (:meth:`config_of`, :func:`kind_validator`); ``of``, a
    registry whose names this one's must be (see the module's docstring).
    """

    def __init__(self, what: str, entries: Iterable[tuple[str, T]] = (), *,
                 config: Callable[[T], type[BaseModel]] | None = None, of: Registry[Any] | None = None) -> None:
        self.what, self._config, self._of = what, config, of
        self._entries: dict[str, T] = {}
        for name, entry in entries:
            self.register(name, entry)

    # --- registering --------------------------------------------------------------------------

    def register(self, name: str, entry: T) -> T:
        """Add ``entry`` as ``name``; a name taken already, or unknown to :attr:`of`, is refused."""
        if name in self._entries:
            raise ValueError(f"{self.what} {name!r} is registered already")
        if self._of is not None and name not in self._of:
            raise ValueError(f"{self.what} {name!r}: {self._of.unknown(name)}")
        self._entries[name] = entry
        return entry

    def unregister(self, name: str) -> T:
        """Remove ``name`` (UnknownName if absent); its entry."""
        entry = self.get(name)
        del self._entries[name]
        return entry

    @contextmanager
    def registered(self, name: str, entry: T) -> Iterator[T]:
        """``entry`` registered as ``name`` for the ``with`` block, then the registry as it was."""
        saved = dict(self._entries)
        self._entries[name] = entry
        try:
            yield entry
        finally:
            self._entries = saved

    # --- asking -------------------------------------------------------------------------------

    @overload
    def get(self, name: str) -> T: ...

    @overload
    def get(self, name: str, default: D) -> T | D: ...

    def get(self, name: str, default: Any = _ABSENT) -> Any:
        """The entry of ``name``; :class:`UnknownName` (a KeyError) naming the known ones if
        none, or ``default`` where one is given (as a mapping's ``get``)."""
        try:
            return self._entries[name]
        except (KeyError, TypeError):
            if default is not _ABSENT:
                return default
            raise UnknownName(self.unknown(name)) from None

    def __getitem__(self, name: str) -> T:
        return self.get(name)

    def config_of(self, name: str) -> type[BaseModel]:
        """The config model of ``name``'s entry."""
        if self._config is None:
            raise TypeError(f"{self.what} entries bring no config model")
        return self._config(self.get(name))

    def names(self) -> tuple[str, ...]:
        return tuple(self._entries)

    def items(self) -> list[tuple[str, T]]:
        return list(self._entries.items())

    def values(self) -> list[T]:
        return list(self._entries.values())

    def missing(self) -> list[str]:
        """The names of :attr:`of` this registry has no entry for (none without ``of``)."""
        return [name for name in self._of.names() if name not in self._entries] if self._of is not None else []

    def __contains__(self, name: object) -> bool:
        return name in self._entries

    def __iter__(self) -> Iterator[str]:
        return iter(tuple(self._entries))

    def __len__(self) -> int:
        return len(self._entries)

    # tests swap an entry with monkeypatch.setitem / delitem
    def __setitem__(self, name: str, entry: T) -> None:
        if self._of is not None and name not in self._of:
            raise ValueError(f"{self.what} {name!r}: {self._of.unknown(name)}")
        self._entries[name] = entry

    def __delitem__(self, name: str) -> None:
        self.unregister(name)

    def __repr__(self) -> str:
        return f"Registry({self.what!r}: {', '.join(self._entries)})"

    # --- messages -----------------------------------------------------------------------------

    def expected(self) -> str:
        """The known names, quoted: ``'command', 'tvm-wheel', 'tvm-source'``."""
        return ", ".join(_written(name) for name in self._entries)

    def hint(self, name: object) -> str:
        """`` (did you mean 'x'?)`` for the nearest known name, or nothing."""
        close = difflib.get_close_matches(str(name), list(self._entries), n=1)
        return f" (did you mean {_written(close[0])}?)" if close else ""

    def unknown(self, name: object, what: str | None = None) -> str:
        """``unknown <what> 'x'; expected one of ...`` with the hint."""
        return f"unknown {what or self.what} {name!r}; expected one of {self.expected()}{self.hint(name)}"


def _written(name: object) -> str:
    """``name`` quoted as the config writes it: a registry keyed by a ``str`` enum's members (the
    metrics, by ``Metric``) shows ``'time'``, not the member's repr."""
    return repr(name.value if isinstance(name, enum.Enum) else name)
