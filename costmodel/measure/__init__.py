"""Measuring this device: timing harness, runners, ceilings, the bench loop, the device
fingerprint, the run-time context, suite grids and the freshness re-timing of a profile.

Imports ``costmodel.families`` (what to run) and ``costmodel.store`` (where results go);
never ``costmodel.model`` or ``costmodel.cli``.
"""
