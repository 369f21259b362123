"""Hyperparameter search on Ray Tune (population-based training first-class)."""
