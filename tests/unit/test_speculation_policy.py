"""The speculation policy: each kind of step measured first, then the faster kind, the other
tried one step in `probe_every`; wide batches and slow periods handled apart."""

from __future__ import annotations

import mlx_paged.speculative.policy as policy_module
from mlx_paged.speculative.policy import SpeculationPolicy


class _Clock:
    def __init__(self):
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def _run(policy: SpeculationPolicy, clock: _Clock, steps: int, seconds: dict, tokens: dict):
    """`steps` steps of 4 rows; each kind takes `seconds[kind]` and emits `tokens[kind]`."""
    kinds = []
    for _ in range(steps):
        kind = policy.choose(4)
        policy.begin(kind, 4)
        policy.emitted(tokens[kind])
        clock.now += seconds[kind]
        kinds.append(kind)
    return kinds


def test_the_faster_kind_runs_and_the_other_is_probed(monkeypatch):
    clock = _Clock()
    monkeypatch.setattr(policy_module.time, "perf_counter", clock)
    policy = SpeculationPolicy(probe_every=4)
    # Speculative steps take twice as long but emit three times the tokens.
    kinds = _run(policy, clock, 14, {True: 0.02, False: 0.01}, {True: 12, False: 4})
    assert kinds[:2] == [True, False]  # each kind measured once
    assert policy.rates[True] > policy.rates[False]
    assert kinds[2:] == [True, True, True, False] * 3  # the slower kind, one step in four


def test_drafts_that_do_not_pay_turn_speculation_off(monkeypatch):
    clock = _Clock()
    monkeypatch.setattr(policy_module.time, "perf_counter", clock)
    policy = SpeculationPolicy(probe_every=8)
    kinds = _run(policy, clock, 18, {True: 0.012, False: 0.01}, {True: 4, False: 4})
    assert kinds[2:10] == [False] * 7 + [True]


def test_wide_batches_never_speculate_and_fixed_policies_always_do():
    assert SpeculationPolicy(max_rows=8).choose(9) is False
    fixed = SpeculationPolicy(adaptive=False)
    assert all(fixed.choose(4) for _ in range(5))


def test_a_period_with_other_work_in_it_is_not_a_rate(monkeypatch):
    clock = _Clock()
    monkeypatch.setattr(policy_module.time, "perf_counter", clock)
    policy = SpeculationPolicy()
    policy.begin(True, 4)
    policy.emitted(8)
    clock.now += 5.0  # an idle engine, or a long prefill
    policy.begin(False, 4)
    assert policy.rates[True] is None
