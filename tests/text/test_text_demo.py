"""`speculate demo text` runs on the embedded pair and prints speeds next to theory."""

from __future__ import annotations

import pytest
from speculate.domains.text.examples.pair import DRAFT_DIR, TARGET_DIR

pytestmark = pytest.mark.skipif(
    not (TARGET_DIR / "model.safetensors").is_file() or not (DRAFT_DIR / "model.safetensors").is_file(),
    reason="the embedded pair is not trained yet")


@pytest.mark.slow
def test_demo_quick(capsys):
    from speculate.domains.text.examples.demo import demo

    assert demo(["--quick"]) == 0
    out = capsys.readouterr().out
    for needle in ("tokens/s", "batch 8", "acceptance alpha", "theory", "speedup"):
        assert needle in out
