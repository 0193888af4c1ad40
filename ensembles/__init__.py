"""Triton-native deployments: the Triton-only baseline (whole model + dynamic batcher, partition ensemble)."""
