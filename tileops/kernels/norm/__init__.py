"""Normalisation kernels."""
