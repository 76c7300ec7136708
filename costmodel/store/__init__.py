"""What is kept on disk: the device profile (the one hand-off between measuring and
predicting), its row validation, file locks and the per-user cache of fitted models."""
