"""warmup_cosine: linear warm-up, cosine decay to a floor, a step budget read at every step."""

from __future__ import annotations

import math

import pytest
import torch

from lltm_train.tasks.schedule import warmup_cosine

PEAK = 2.0


def make(total, warmup_fraction=0.1, final_fraction=0.0):
    optimizer = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=PEAK)
    budget = {"total": total}
    scheduler = warmup_cosine(optimizer, lambda: budget["total"], warmup_fraction, final_fraction)
    return optimizer, scheduler, budget


def lrs(optimizer, scheduler, steps):
    """The lr used at optimiser steps 0 .. steps - 1 (the scheduler stepped after each, as Lightning does)."""
    out = []
    for _ in range(steps):
        out.append(optimizer.param_groups[0]["lr"])
        optimizer.step()
        scheduler.step()
    return out


def test_exact_factors_at_the_landmarks():
    optimizer, scheduler, _ = make(100, warmup_fraction=0.1, final_fraction=0.0)  # 10 warm-up steps
    lr = lrs(optimizer, scheduler, 111)
    assert lr[0] == pytest.approx(PEAK * 1 / 10)  # first step: 1/warmup of the peak, not 0
    assert lr[4] == pytest.approx(PEAK * 5 / 10)
    assert lr[9] == pytest.approx(PEAK)  # last warm-up step reaches the peak
    assert lr[10] == pytest.approx(PEAK)  # start of the cosine: progress 0
    assert lr[55] == pytest.approx(PEAK * 0.5)  # half way through the 90 decay steps
    assert lr[10 + 30] == pytest.approx(PEAK * 0.5 * (1 + math.cos(math.pi / 3)))  # = 0.75 of the peak
    assert lr[100] == pytest.approx(0.0, abs=1e-12)  # the end
    assert lr[110] == pytest.approx(0.0, abs=1e-12)  # past the end: stays at the floor
    assert all(a <= b for a, b in zip(lr[:10], lr[1:11]))  # warm-up increases
    assert all(a >= b for a, b in zip(lr[10:100], lr[11:101]))  # decay decreases


def test_final_fraction_is_the_floor():
    optimizer, scheduler, _ = make(100, warmup_fraction=0.1, final_fraction=0.1)
    lr = lrs(optimizer, scheduler, 121)
    assert lr[9] == pytest.approx(PEAK)
    assert lr[55] == pytest.approx(PEAK * (0.1 + 0.9 * 0.5))  # 0.55 of the peak
    assert lr[100] == pytest.approx(PEAK * 0.1)
    assert lr[120] == pytest.approx(PEAK * 0.1)
    assert min(lr) == pytest.approx(PEAK * 0.1)  # never below the floor


def test_factor_function_values():
    _, scheduler, _ = make(40, warmup_fraction=0.25, final_fraction=0.2)  # 10 warm-up steps, 30 decay steps
    factor = scheduler.lr_lambdas[0]
    assert [factor(s) for s in (0, 1, 9)] == pytest.approx([0.1, 0.2, 1.0])
    assert factor(10) == pytest.approx(1.0)
    assert factor(25) == pytest.approx(0.2 + 0.8 * 0.5)
    assert factor(40) == pytest.approx(0.2)
    assert factor(1000) == pytest.approx(0.2)


def test_zero_warmup_starts_at_the_peak():
    _, scheduler, _ = make(10, warmup_fraction=0.0)
    factor = scheduler.lr_lambdas[0]
    assert factor(0) == pytest.approx(1.0)  # a warm-up of one step is no warm-up
    assert factor(1) == pytest.approx(1.0)
    assert factor(10) == pytest.approx(0.0, abs=1e-12)


def test_infinite_budget_keeps_the_peak():
    optimizer, scheduler, _ = make(math.inf, warmup_fraction=0.1, final_fraction=0.0)
    lr = lrs(optimizer, scheduler, 50)
    assert lr == pytest.approx([PEAK] * 50)


def test_a_larger_budget_read_later_stretches_the_decay():
    optimizer, scheduler, budget = make(100, warmup_fraction=0.1, final_fraction=0.0)
    before = lrs(optimizer, scheduler, 55)  # steps 0 .. 54 with a budget of 100
    assert before[54] == pytest.approx(PEAK * 0.5 * (1 + math.cos(math.pi * 44 / 90)))
    budget["total"] = 200  # e.g. resumed with a larger trainer.max_steps: 20 warm-up steps, 180 decay steps
    after = lrs(optimizer, scheduler, 146)  # steps 55 .. 200
    # step 55's lr was set by the scheduler step before the change (the old middle); from step 56 on, the new budget
    assert after[0] == pytest.approx(PEAK * 0.5)
    assert after[1] == pytest.approx(PEAK * 0.5 * (1 + math.cos(math.pi * 36 / 180)))  # step 56: back up, 0.90 of the peak
    assert after[110 - 55] == pytest.approx(PEAK * 0.5)  # the new middle: step 20 + 90
    assert after[100 - 55] == pytest.approx(PEAK * 0.5 * (1 + math.cos(math.pi * 80 / 180)))  # the old end, far from 0
    assert after[200 - 55] == pytest.approx(0.0, abs=1e-12)


def test_state_dict_round_trip_follows_the_new_budget():
    optimizer, scheduler, _ = make(100)
    lrs(optimizer, scheduler, 30)
    state = scheduler.state_dict()
    optimizer2, scheduler2, _ = make(300)
    scheduler2.load_state_dict(state)
    assert scheduler2.last_epoch == 30
    factor = scheduler2.lr_lambdas[0]  # the closure was not replaced by the saved one
    assert factor(15) == pytest.approx(16 / 30)  # the new budget's warm-up: 30 steps
    assert factor(165) == pytest.approx(0.5)  # the middle of its 270 decay steps


@pytest.mark.parametrize("warmup_fraction, final_fraction", [
    (1.0, 0.0), (-0.1, 0.0), (1.5, 0.0), (math.nan, 0.0),
    (0.1, -0.1), (0.1, 1.01), (0.1, math.nan),
])
def test_invalid_fractions_are_refused(warmup_fraction, final_fraction):
    optimizer = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=1.0)
    with pytest.raises(ValueError, match=r"warmup_fraction must be in \[0, 1\) and final_fraction in \[0, 1\]"):
        warmup_cosine(optimizer, lambda: 100, warmup_fraction, final_fraction)


def test_boundary_fractions_are_accepted():
    optimizer = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=1.0)
    scheduler = warmup_cosine(optimizer, lambda: 10, 0.0, 1.0)  # final 1: a constant lr
    assert [scheduler.lr_lambdas[0](s) for s in range(12)] == pytest.approx([1.0] * 12)


def test_warmup_steps_fix_the_warm_up_whatever_the_budget_says():
    """A time budget's step count is a provisional 1e6 until the pace is known, then an estimate: a warm-up of
    warmup_steps steps goes up by the same amounts whatever the estimate, then decays over what it says."""
    optimizer = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=PEAK)
    budget = {"total": 1e6}
    scheduler = warmup_cosine(optimizer, lambda: budget["total"], warmup_steps=4)
    first = lrs(optimizer, scheduler, 2)
    budget["total"] = 12  # the pace is known: 12 steps in all
    rest = lrs(optimizer, scheduler, 11)
    assert first + rest[:2] == pytest.approx([PEAK * s / 4 for s in (1, 2, 3, 4)])
    assert rest[2 + 4] == pytest.approx(PEAK * 0.5)  # step 8: half way through the 8 decay steps
    assert rest[-1] == pytest.approx(0.0, abs=1e-12)
    # no end (no budget at all): the warm-up still applies, then the peak
    assert [warmup_cosine(optimizer, lambda: math.inf, warmup_steps=4).lr_lambdas[0](s) for s in (0, 3, 9)] == \
        pytest.approx([0.25, 1.0, 1.0])


@pytest.mark.parametrize("warmup_steps", [-1, 2.5, True, "10"])
def test_invalid_warmup_steps_are_refused(warmup_steps):
    optimizer = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=1.0)
    with pytest.raises(ValueError, match="warmup_steps must be a whole number >= 0"):
        warmup_cosine(optimizer, lambda: 100, warmup_steps=warmup_steps)
