"""The draft kinds: one class each, built in one place from Langevin(draft_force=...), and a
replica never drafts more steps than it still needs."""

from __future__ import annotations

import numpy as np
import pytest
from speculate.domains.physics import (
    DoubleWell,
    ForceDraft,
    FrozenCorrection,
    FrozenDraft,
    Langevin,
    frozen_correction,
    speculative_simulate,
)
from speculate.domains.physics.drafts import as_draft


class Counting:
    """A force that records the batch size of every call."""

    def __init__(self, force):
        self.force, self.calls = force, []

    def __call__(self, X):
        self.calls.append(X.shape[0])
        return self.force(X)


def test_each_draft_force_becomes_one_draft_class():
    well = DoubleWell()
    corrected = frozen_correction(well)
    assert isinstance(Langevin(force=well).draft, FrozenDraft)  # the default: "frozen"
    assert Langevin(force=well, draft_force=well).draft == ForceDraft(well)
    assert Langevin(force=well, draft_force=corrected).draft is corrected
    assert isinstance(corrected, FrozenCorrection) and corrected.draft is well
    assert as_draft(FrozenDraft()) == FrozenDraft()  # a draft object is taken as it is
    model = Langevin(force=well, draft_force="frozen")
    assert model.draft_force == "frozen" and "draft=" not in repr(model)  # the argument is kept
    for bad in ("freeze", 3.0, None):
        with pytest.raises(ValueError, match="draft_force"):
            as_draft(bad)
    with pytest.raises(TypeError, match="callable"):
        frozen_correction(1.0)


@pytest.mark.parametrize("kind", ["function", "corrected"])
def test_no_row_drafts_more_than_it_needs(kind):
    """A perfect draft with lookahead 8 and 5 steps to go: one round of 4 drafts and the bonus step
    (the last draft would be of no use), so 4 cheap-force calls, not 8."""
    well = DoubleWell()
    cheap = Counting(well)
    draft = cheap if kind == "function" else frozen_correction(cheap)
    model = Langevin(force=well, draft_force=draft, dt=0.01)
    B = 3
    sim = speculative_simulate(model, np.zeros((B, 1, 1)), 5, lookahead=8, rng=0)
    st = sim.stats
    if kind == "function":
        assert st.target_calls == 1 and st.proposed == 4 * B and st.accepted == 4 * B
        assert cheap.calls == [B] * 4
    else:  # the first round of a row is a plain step (no exact force known yet), then 3 drafts
        assert st.target_calls == 2 and st.proposed == 3 * B and st.accepted == 3 * B
        assert cheap.calls == [B] * 4  # cheap(x_ref) once, then one call per drafted step
    assert st.target_configurations == st.proposed + st.row_rounds


def test_rows_near_their_end_draft_fewer_and_the_others_go_on():
    """Replicas advance at different speeds; whatever each still needs, no round drafts past it."""
    well = DoubleWell()
    cheap = Counting(DoubleWell(tilt=1.0))  # an imperfect draft: rows fall out of step
    model = Langevin(force=well, draft_force=cheap, dt=0.05)
    n = 23
    sim = speculative_simulate(model, np.zeros((16, 1, 1)), n, lookahead=6, rng=3)
    st = sim.stats
    assert 0 < st.rejections and st.emitted == 16 * n
    assert st.verified == st.emitted  # no verified step is thrown away
    assert sum(cheap.calls) == st.proposed  # the cheap force ran only on drafted steps
