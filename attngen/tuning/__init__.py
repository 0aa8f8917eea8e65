"""Tuning: config spaces (space.py, no optional deps); the Optuna tuner arrives with its issue."""
