"""Calibration shared by the statistical tests (see conftest.py for the reasoning)."""

ALPHA = 1e-7  # per check; fewer than 200 checks in the suite -> family-wise false alarms < 2e-5
