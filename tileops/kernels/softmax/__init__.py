"""Softmax kernels."""
