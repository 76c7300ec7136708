"""Predicting: features of a kernel table, the L0-L3 cost models, the per-profile predictor
and their held-out evaluation. Reads profiles (``costmodel.store``); measures nothing."""
