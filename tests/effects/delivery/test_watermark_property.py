"""The generation watermark as a normalized, non-overlapping interval map (contract `mutation_policies.watermark`):
the pure `watermark.apply` against a brute-force per-point max model, and the database split/merge
(`finalization.apply_watermark`, under the domain lock, against the exclusion constraints) against the pure map."""
from __future__ import annotations

from datetime import UTC, date, datetime, timedelta
from itertools import count

import pytest
from django.db import transaction
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from effects.delivery import watermark
from effects.models import DeliveryOperation, DeliveryWatermark
from effects.services.delivery import finalization, planning

POINTS = st.integers(min_value=0, max_value=40)
GENERATIONS = st.tuples(st.integers(min_value=0, max_value=4), st.integers(min_value=0, max_value=3))


@st.composite
def applications(draw, max_size: int = 12):
    steps = []
    for _ in range(draw(st.integers(min_value=1, max_value=max_size))):
        a, b = draw(POINTS), draw(POINTS)
        if a == b:
            b = a + 1
        steps.append((min(a, b), max(a, b), draw(GENERATIONS)))
    return steps


def per_point(steps) -> dict:
    model: dict = {}
    for start, end, gen in steps:
        for p in range(start, end):
            model[p] = max(model.get(p, gen), gen)
    return model


def expand(intervals) -> dict:
    out: dict = {}
    for start, end, gen in intervals:
        for p in range(start, end):
            assert p not in out, f"point {p} covered twice in {intervals}"
            out[p] = gen
    return out


def assert_normalized(intervals) -> None:
    for start, end, _ in intervals:
        assert start < end, intervals
    for (s1, e1, g1), (s2, e2, g2) in zip(intervals, intervals[1:]):
        assert e1 <= s2, f"overlap or disorder: {intervals}"
        assert not (e1 == s2 and g1 == g2), f"unmerged equal neighbours: {intervals}"
    assert watermark.normalize(intervals) == intervals


@given(applications())
@settings(max_examples=400, deadline=None)
def test_apply_keeps_a_normalized_map_equal_to_per_point_max(steps):
    """Proves: generation_watermark_is_range_scoped (the interval map: after any sequence of full applications
    it is normalized (sorted, non-empty, non-overlapping, equal neighbours merged), every point holds the highest
    generation applied to it and no other point is covered; a generation is never lowered; `highest_over`
    answers the brute-force max over any range)."""
    marks: list = []
    for i, (start, end, gen) in enumerate(steps):
        before = expand(marks)
        marks = watermark.apply(marks, start, end, gen)
        assert_normalized(marks)
        after = expand(marks)
        assert all(after[p] >= g for p, g in before.items())  # monotonic
        assert after == per_point(steps[: i + 1])
    model = per_point(steps)
    for lo in range(0, 42, 5):
        for hi in range(lo + 1, 43, 7):
            inside = [g for p, g in model.items() if lo <= p < hi]
            assert watermark.highest_over(marks, lo, hi) == (max(inside) if inside else None)


# -- the database map --------------------------------------------------------------------------------------------

D0 = date(2026, 1, 1)
T0 = datetime(2026, 1, 1, tzinfo=UTC)
_groups = count()


def _domain():
    (lock,) = planning.domain_locks([planning.ConflictDomain("svc", "acct", "ns", "res",
                                                             f"wm-{next(_groups)}-{datetime.now().timestamp()}")])
    return lock


def _as_db(kind: str, start: int, end: int, gen):
    if kind == "date":
        rng = planning.make_range("date", D0 + timedelta(days=start), D0 + timedelta(days=end))
    else:
        rng = planning.make_range("timestamp", T0 + timedelta(hours=start), T0 + timedelta(hours=end))
    return rng, (T0 + timedelta(days=gen[0]), gen[1])


def _rows(domain, kind: str) -> list:
    field = "scope_date" if kind == "date" else "scope_ts"
    unit = timedelta(days=1) if kind == "date" else timedelta(hours=1)
    origin = D0 if kind == "date" else T0
    out = []
    for w in DeliveryWatermark.objects.filter(domain=domain):
        rng = getattr(w, field)
        out.append(((rng.lower - origin) // unit, (rng.upper - origin) // unit,
                     ((w.generation_end - T0).days, w.correction_revision)))
    return sorted(out)


@pytest.mark.parametrize("kind", ["date", "timestamp"])
@given(steps=applications(max_size=8))
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture,
                                                                  HealthCheck.too_slow])
def test_apply_watermark_rows_equal_the_pure_map(kind, steps):
    """Proves: generation_watermark_is_range_scoped (the PostgreSQL map: full effects applied through
    finalization.apply_watermark, each in its own transaction under the domain lock, over random overlapping
    ranges leave DeliveryWatermark rows equal to the pure interval map; the exclusion constraint never fires)."""
    domain = _domain()
    marks: list = []
    for start, end, gen in steps:
        rng, (gen_end, revision) = _as_db(kind, start, end, gen)
        op = DeliveryOperation(domain_id=domain.pk, generation_end=gen_end, correction_revision=revision,
                               **planning.scope_kwargs(kind, rng))  # the fields apply_watermark reads
        with transaction.atomic():
            planning.domain_lock_for_update(domain.pk)
            finalization.apply_watermark(op)
        marks = watermark.apply(marks, start, end, gen)
        assert _rows(domain, kind) == marks
    assert expand(_rows(domain, kind)) == per_point(steps)
