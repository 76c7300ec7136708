"""Workloads on devices: ``placement`` puts predictable workloads on devices so the slowest
finishes first (``PlacementWorkload``, ``Device``, ``place``), ``executor`` runs placements
for real, one pinned worker process per device, and ``placement_workloads`` builds the
project's layers as placement workloads (the ``_target_`` builders of
``conf/placement_mix/``).

Imports ``costmodel``, ``sim/workloads/`` and ``sim/predict/``.
"""
