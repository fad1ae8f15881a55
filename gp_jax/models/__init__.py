"""flax.nnx modules: span heads and encoders."""

from gp_jax.models.heads import HEADS, EfficientGlobalPointer, GlobalPointer

__all__ = ["GlobalPointer", "EfficientGlobalPointer", "HEADS"]
