"""Elementwise kernels: activations, gated activations, broadcasting add and multiply."""
