"""Scan (prefix) kernels."""
