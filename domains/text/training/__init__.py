"""Training drafts on a target: distillation of a draft model (``distill.py``), Medusa heads
(``heads.py``) and the EAGLE-style feature draft (``feature_draft.py``; its decoding form with folded
weights in ``feature_decode.py``). The drafts that run them are in ``drafts/``."""
