"""A regression's explanation (:mod:`service.store.explain`) as alerts and a pull request's
comment say it: the top five rows, names shortened, in plain lines or a Markdown table."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

SHOWN = 5  # rows a comment or an alert shows; the page and the API show every stored one


def text_lines(explained: Mapping[str, Any], shown: int = SHOWN) -> list[str]:
    """The explanation as a few plain lines (an alert's text; names shortened)."""
    rows = list(explained.get("rows") or [])[:shown]
    if explained.get("what") == "functions" and rows:
        head = f"functions that grew most ({explained.get('region')} instructions, {explained.get('source')}):"
        lines = [f"  {r['short']}: {_count(r['control'])} -> {_count(r['treatment'])} "
                 f"(+{r['change']:,}{_pct(r.get('change_pct'), ', ')})" for r in rows]
    elif explained.get("what") == "operators" and rows:
        head = "operators whose time changed most:"
        lines = [f"  {r.get('features') or r.get('name')}: {_us(r.get('control_us'))} -> "
                 f"{_us(r.get('treatment_us'))}{_pct(r.get('change_pct'), ' ')}" for r in rows]
    else:
        return [f"no profile: {explained.get('reason')}"]
    unnamed = _unnamed(explained)
    return [head, *lines, *([f"  {unnamed}"] if unnamed else []),
            *([f"  ({explained['note']})"] if explained.get("note") else [])]


def markdown_lines(explained: Mapping[str, Any], cell, shown: int = SHOWN) -> list[str]:
    """The explanation as a Markdown table (``cell`` makes database text safe in a cell)."""
    rows = list(explained.get("rows") or [])[:shown]
    if explained.get("what") == "functions" and rows:
        lines = [f"Functions that grew most ({explained.get('region')} instructions, {cell(str(explained.get('source')))}):",
                 "", "| function | control | treatment | growth |", "| --- | --- | --- | --- |"]
        lines += [f"| `{cell(r['short']).replace('`', chr(39))}` | {_count(r['control'])} | {_count(r['treatment'])} | "
                  f"+{r['change']:,}{_pct(r.get('change_pct'), ' ')} |" for r in rows]
    elif explained.get("what") == "operators" and rows:
        lines = ["Operators whose time changed most:", "", "| operator | control | treatment | change |",
                 "| --- | --- | --- | --- |"]
        lines += [f"| {cell(str(r.get('features') or r.get('name')))} | {_us(r.get('control_us'))} | "
                  f"{_us(r.get('treatment_us'))} | {_pct(r.get('change_pct'), '') or '–'} |" for r in rows]
    else:
        return [f"No profile: {cell(str(explained.get('reason')))}."]
    unnamed = _unnamed(explained)
    return (lines + (["", unnamed[0].upper() + unnamed[1:] + "."] if unnamed else [])
            + (["", f"_{cell(explained['note'])}_"] if explained.get("note") else []))


def _unnamed(explained: Mapping[str, Any]) -> str:
    """What code without a symbol added, where it grew (most of a release wheel's libtvm.so)."""
    found = explained.get("no_symbol") or {}
    if explained.get("what") != "functions" or not found.get("change") or found["change"] <= 0:
        return ""
    share = f", {found['share_pct']:.0f}% of the change" if found.get("share_pct") is not None else ""
    return f"code without a symbol (a stripped library's own functions): +{found['change']:,}{share}"


def _count(value: int | None) -> str:
    return "(not in top)" if value is None else f"{value:,}"


def _us(value: float | None) -> str:
    return "–" if value is None else f"{value:,.1f} µs"


def _pct(value: float | None, sep: str) -> str:
    return "" if value is None else f"{sep}{value:+.1f}%"
