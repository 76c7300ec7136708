"""From traces to latency, and how good that is: ``simulator`` predicts a trace with every
cost-model level and measures the real module beside it, ``calibration`` measures and fits
on first use, ``paired`` times a trace's kernels in the same rounds as its layers,
``heldout`` scores predictions with models that never saw the experiment's kernels and
``heldout_drift`` corrects them for the machine's drift from kernels the experiment does not
run.

Imports ``costmodel`` and ``sim/workloads/``.
"""
