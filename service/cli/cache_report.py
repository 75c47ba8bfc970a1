"""``abwatch cache`` in the terminal: the artifact cache's entries, the shared artifact store
and the compiler cache (the ``--json`` shape is :func:`service.read.serialize.cache_json`)."""

from __future__ import annotations

from rich import box
from rich.console import Console
from rich.table import Table

from abwatch.service.read.serialize import short_sha


def print_cache(out: Console, cache, entries, size: int, compiler: dict | None = None,
                store: dict | None = None) -> None:
    """The artifact cache's entries as a table (keys whole: they fold, never get cut; with a
    store, whether each is in it), then the store and the compiler cache (:func:`print_compiler_cache`)."""
    table = Table(title=f"{cache.root}: {len(entries)} entries, {size / 2**20:.1f} MiB on disk",
                  box=box.SIMPLE_HEAD)
    checked = any(e.check for e in entries)
    columns = ("key", "builder", "sha", "last used", "files", "packed") + (("check",) if checked else ()) \
        + (("in store",) if store else ())
    for column in columns:
        table.add_column(column, overflow="fold")
    for e in entries:
        shared = (store["shared"].get(e.key),) if store else ()
        table.add_row(e.key, e.builder or "", short_sha(e.sha or ""), e.last_used[:19], str(e.files),
                      str(e.packed_files), *((e.check or "",) if checked else ()),
                      *(("yes" if m else "no" if store and store["manifests"] is not None else "?") for m in shared))
    out.print(table)
    if store:
        state = "reachable" if store["reachable"] else f"unreachable ({store['problem']})"
        held = f"{store['manifests']} artifact(s) in it" if store["manifests"] is not None else store["note"]
        out.print(f"artifact store {store['store']}: {state}; {held}", markup=False)
    print_compiler_cache(out, compiler)


def print_compiler_cache(out: Console, data: dict | None) -> None:
    """``abwatch cache``'s compiler-cache part (tvm-source): the local ccache, the shared remote
    storage and whether it answers now, and each recent build's local and remote hits."""
    if data is None:
        return
    life = data["lifetime"]
    out.print(f"compiler cache {data['dir']}: " + (life["summary"] + " in its lifetime" if life else "no counts yet"),
              markup=False)
    if data["remote"]:
        state = "reachable" if data["remote_reachable"] else f"unreachable ({data['remote_problem']})"
        out.print(f"remote storage {data['remote']}: {state}", markup=False)
    else:
        out.print("remote storage: none ([build] ccache_remote)", markup=False)
    if data["builds_note"]:
        out.print(data["builds_note"], markup=False)
    if not data["builds"]:
        return
    table = Table(title="compiler cache of the newest tvm-source builds", box=box.SIMPLE_HEAD)
    for column in ("id", "commit", "status", "created", "hits and misses"):
        table.add_column(column, overflow="fold", no_wrap=column in ("id", "commit", "created"))
    for b in data["builds"]:
        hits = b["compiler_cache"]
        table.add_row(str(b["id"]), short_sha(b["sha"]), b["status"], (b["created_at"] or "")[:16].replace("T", " "),
                      hits["summary"] if hits else "-")
    out.print(table)
