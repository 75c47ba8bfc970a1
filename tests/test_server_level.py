"""The fork server as a level of the statistics (service.stats.levels): pairs whose processes
were children of shared servers are judged with the servers' layouts as a random effect."""

from __future__ import annotations

import numpy as np
import pytest

from abwatch.service.stats import Outcome, compare
from abwatch.service.stats.levels import MIN_BLOCKS, children_within, server_level

CHILDREN = 8  # children a server: the runner's default


def forked_pairs(rng, pairs: int, change: float, layout_sd: float, noise_sd: float = 0.01, samples: int = 3):
    """``pairs`` interleaved pairs of forked processes, ``CHILDREN`` to a server on each side:
    each server's memory layout moves all its children's times by its own offset (sd
    ``layout_sd``); flat samples with their process and server labels, as the driver passes them."""
    servers = (pairs + CHILDREN - 1) // CHILDREN
    offsets = {side: rng.normal(0.0, layout_sd, servers) for side in ("control", "treatment")}
    data = {side: ([], [], []) for side in offsets}
    for i in range(pairs):
        for side, number in (("control", 2 * (i // CHILDREN)), ("treatment", 2 * (i // CHILDREN) + 1)):
            level = np.log(10.0 * (1 + change if side == "treatment" else 1.0)) + offsets[side][i // CHILDREN]
            values, groups, labels = data[side]
            values += list(np.exp(level + rng.normal(0.0, noise_sd, samples)))
            groups += [i] * samples
            labels += [number] * samples
    (a, ga, sa), (b, gb, sb) = data["control"], data["treatment"]
    return a, b, dict(control_groups=ga, treatment_groups=gb, paired=True), dict(control_servers=sa,
                                                                                  treatment_servers=sb)


def test_layouts_shared_by_a_servers_children_are_no_regression_once_the_server_is_a_level():
    """A/A between servers whose layouts differ by ~1.5 %: judged as independent pairs, about
    one comparison in five calls a change; with the server as a level, at most 2 in 100."""
    rng = np.random.default_rng(40)
    trials, naive, levelled = 300, 0, 0
    for _ in range(trials):
        a, b, paired, servers = forked_pairs(rng, 32, 0.0, layout_sd=0.015)
        naive += compare(a, b, **paired).verdict in (Outcome.REGRESSION, Outcome.IMPROVEMENT)
        levelled += compare(a, b, **paired, **servers).verdict in (Outcome.REGRESSION, Outcome.IMPROVEMENT)
    assert naive >= 0.08 * trials, naive  # the problem is real at these figures
    assert levelled <= 0.02 * trials, levelled


def test_a_real_change_is_still_found_through_forked_servers():
    rng = np.random.default_rng(41)
    found = 0
    for _ in range(50):
        a, b, paired, servers = forked_pairs(rng, 48, 0.05, layout_sd=0.003)
        verdict = compare(a, b, **paired, **servers)
        found += verdict.verdict == Outcome.REGRESSION
        assert verdict.design_effect is not None and verdict.design_effect >= 1.0
    assert found >= 45, found


def test_fresh_processes_are_judged_as_before():
    """Servers all None (fresh processes, each its own): the verdict is the one without labels."""
    rng = np.random.default_rng(42)
    a, b, paired, servers = forked_pairs(rng, 16, 0.03, layout_sd=0.0)
    fresh = dict(control_servers=[None] * len(a), treatment_servers=[None] * len(b))
    assert compare(a, b, **paired, **fresh) == compare(a, b, **paired)
    assert compare(a, b, **paired).design_effect is None


def test_too_few_server_pairs_give_no_interval_and_say_why():
    rng = np.random.default_rng(43)
    a, b, paired, servers = forked_pairs(rng, 16, 0.10, layout_sd=0.0)  # two servers a side
    verdict = compare(a, b, **paired, **servers)
    assert verdict.verdict == Outcome.UNKNOWN and verdict.ci_pct is None
    assert f"16 pairs; 2 server pairs served two or more, {MIN_BLOCKS} are needed" in verdict.reason, verdict.reason
    assert "fork servers as a level: 2 server pairs" in verdict.method
    a, b, paired, servers = forked_pairs(rng, 17, 0.10, layout_sd=0.0)  # a third server pair with one pair
    assert compare(a, b, **paired, **servers).verdict == Outcome.UNKNOWN
    a, b, paired, servers = forked_pairs(rng, 18, 0.10, layout_sd=0.0)  # ... and with two
    assert compare(a, b, **paired, **servers).verdict == Outcome.REGRESSION


def test_the_level_is_estimated_from_the_blocks():
    rng = np.random.default_rng(44)
    labels = [i // 8 for i in range(40)]
    offsets = rng.normal(0.0, 0.05, 5)
    shared = server_level(np.array([offsets[g] for g in labels]) + rng.normal(0, 1e-4, 40), labels)
    assert shared is not None and shared.blocks == shared.shared == 5 and shared.rho > 0.99
    assert shared.design_effect == pytest.approx(1 + 7 * shared.rho) and shared.units == 5
    independent = server_level(rng.normal(0, 0.01, 40), labels)
    assert independent is not None and independent.rho < 0.5 and independent.design_effect >= 1.0
    assert server_level(np.zeros(4), [1, 2, 3, 4]) is None  # no two pairs share a block
    one_alone = server_level(rng.normal(0, 0.01, 17), labels[:17])  # 8 + 8 + 1 pairs
    assert one_alone is not None and one_alone.blocks == 3 and one_alone.shared == 2
    with pytest.raises(ValueError, match="server labels: 3 labels for 4 pairs"):
        server_level(np.zeros(4), [1, 1, 2])


def test_the_level_stays_said_when_a_run_corrects_for_many_workloads():
    from abwatch.service.stats import adjust_fdr

    rng = np.random.default_rng(45)
    a, b, paired, servers = forked_pairs(rng, 32, 0.05, layout_sd=0.003)
    judged = compare(a, b, **paired, **servers)
    (corrected, _) = adjust_fdr([judged, compare(a, a, **paired, **servers)])
    assert corrected.correction == "benjamini-hochberg" and corrected.design_effect == judged.design_effect
    assert "BH-adjusted p=" in corrected.reason and corrected.reason.endswith(judged.reason.partition("; ")[2])


@pytest.mark.parametrize("cap", range(6, 41))
def test_a_capped_run_serves_the_most_children_that_still_give_three_server_pairs(cap):
    """``children_within``: pairs served so, interleaved as the driver does, come from
    MIN_BLOCKS server pairs of two or more; one child more a server would not."""
    def shared(children: int) -> int:
        labels = [(i // children, i // children) for i in range(cap)]  # (control server, treatment server)
        return server_level(np.zeros(cap), labels).shared

    children = children_within(cap)
    assert children >= 2 and shared(children) >= MIN_BLOCKS
    assert shared(children + 1) < MIN_BLOCKS
