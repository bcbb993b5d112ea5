"""Cross-entropy kernels."""
