"""Tuning: the Optuna tuner, its objective, sampling and timing; the config spaces it searches are attngen/configs.py."""
