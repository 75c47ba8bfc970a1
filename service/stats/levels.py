"""The level above the process: pairs whose processes were forked from shared fork servers.

Forked TVM workers (``[runner] processes = "forked"``) are children of a per-build, per-side
fork server, and the children of one server share its memory layout, which can move a run
time by a few percent (Mytkowicz et al., ASPLOS 2009). The pairs served by one control
server and one treatment server (a *block*) then share an offset that more pairs of the same
block never average away: judged as independent pairs, an A/A comparison between two servers
with different layouts is a false regression (simulated layouts of 1.5 % beside 1 % of pair
noise, 32 pairs: 18-26 % of A/A comparisons called a change; docs/statistics.md).

The level is taken as a random effect (Kalibera & Jones, ISMM 2013, take the levels of an
experiment so): a one-way analysis of variance of the pairs' (winsorized) log ratios by
block estimates the intraclass correlation rho, the variance of the mean grows by Kish's
design effect ``1 + (m - 1) rho`` (``m``: the pairs-weighted mean block size), and where rho
is above zero the interval's small-sample widening counts blocks, not pairs, as the
independent units. Fewer than :data:`MIN_BLOCKS` blocks of two pairs or more cannot tell a
layout from a change, so no interval is given before then.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

# Two blocks leave one degree of freedom for the between-server variance: its estimate is
# mostly 0 when the truth is not, and a 2 % layout effect was called a change in 13 % of
# simulated A/A comparisons at 16 pairs (design effect alone); from three blocks on, with
# blocks as the units, 0-0.7 % (docs/statistics.md).
MIN_BLOCKS = 3


@dataclass(frozen=True)
class ServerLevel:
    """What the shared fork servers did to the paired pairs' spread: how many blocks (distinct
    server pairs) the pairs came from, their intraclass correlation and the design effect."""

    blocks: int
    rho: float  # the share of the pairs' variance between blocks, >= 0
    design_effect: float  # how many times the variance of the mean grows, >= 1
    # blocks of two pairs or more: a block of one pair says nothing of the variance within
    # blocks, so only these count towards MIN_BLOCKS
    shared: int = 0

    @property
    def units(self) -> int | None:
        """The independent units the spread is estimated from, for the small-sample widening:
        the blocks wherever any variance between them was estimated (rho > 0); else None (the
        pairs). A step, not Kish's continuous effective size (pairs over the design effect):
        that one let 1.8-2.8 % of simulated A/A comparisons call a change at 24-32 pairs (1-2 %
        layouts), the step 0-0.7 %, because a small rho is most often an underestimate."""
        return self.blocks if self.rho > 0 else None

    def describe(self) -> str:
        """One line for a verdict's method: what the level did."""
        return (f"fork servers as a level: {self.blocks} server pairs, intraclass correlation {self.rho:.2f}, "
                f"design effect {self.design_effect:.2f}")


def server_level(winsorized: np.ndarray, labels: Sequence) -> ServerLevel | None:
    """The server level of pairs whose winsorized log ratios are ``winsorized`` and whose
    blocks are ``labels`` (one hashable label a pair, e.g. its (control server, treatment
    server)); None where no two pairs share a block (fresh processes: no level to take)."""
    if len(labels) != len(winsorized):
        raise ValueError(f"server labels: {len(labels)} labels for {len(winsorized)} pairs")
    index: dict = {}
    for label in labels:
        index.setdefault(label, len(index))
    n, k = len(labels), len(index)
    if k == n:
        return None
    block = np.array([index[label] for label in labels])
    sizes = np.bincount(block)
    shared = int((sizes >= 2).sum())
    if k < 2:
        return ServerLevel(blocks=k, rho=0.0, design_effect=1.0, shared=shared)
    rho = intraclass(winsorized, block)
    weighted_size = float((sizes ** 2).sum()) / n
    return ServerLevel(blocks=k, rho=rho, design_effect=1.0 + (weighted_size - 1.0) * rho, shared=shared)


def shared_blocks(pairs: int, children: int) -> int:
    """The server pairs of two pairs or more that ``pairs`` interleaved pairs make where each
    side's fork server serves ``children`` of them (a last server pair of one pair counts none)."""
    return pairs // children + (pairs % children >= 2)


def children_within(pairs: int) -> int:
    """The most children a fork server may serve so that ``pairs`` pairs a side come from
    :data:`MIN_BLOCKS` server pairs of two pairs or more (a run capped at ``pairs`` then still
    gives an interval); never fewer than two (below twice :data:`MIN_BLOCKS` pairs no count
    reaches them, and a server of one child costs a fresh process's import)."""
    return max([r for r in range(2, pairs + 1) if shared_blocks(pairs, r) >= MIN_BLOCKS], default=2)


def intraclass(values: np.ndarray, group: np.ndarray, fitted: int = 1) -> float:
    """The intraclass correlation of ``values`` in groups ``group`` (0..k-1, each used, k > fitted,
    fewer groups than values): the share of their variance between groups, by the one-way
    analysis of variance (its estimator for unequal groups), 0 where it estimates none.
    ``fitted``: the means already taken out of ``values`` across groups (1: the grand mean;
    more where, say, each side's mean was), each a degree of freedom the groups' spread lost."""
    n, sizes = len(values), np.bincount(group)
    k = len(sizes)
    means = np.bincount(group, values) / sizes
    between = float((sizes * (means - values.mean()) ** 2).sum() / (k - fitted))
    within = float(((values - means[group]) ** 2).sum() / (n - k))
    # the mean group size the estimator divides by, for unequal groups
    n0 = (n - float((sizes ** 2).sum()) / n) / (k - 1)
    spread = max(0.0, (between - within) / n0)
    return spread / (spread + within) if spread + within > 0 else 0.0
