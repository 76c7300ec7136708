"""The command line of ``python -m costmodel``: the bench, fit, compare and fleet commands,
Hydra launchers and the sweep check, the console and user-error reporting, plots."""
