"""flax.nnx modules: span heads, tagger heads (baselines) and encoders."""

from gp_jax.models.gplinker import GPLinkerHead
from gp_jax.models.heads import HEADS, EfficientGlobalPointer, GlobalPointer
from gp_jax.models.taggers import TAGGERS, CrfTagger, SoftmaxTagger

__all__ = ["GlobalPointer", "EfficientGlobalPointer", "HEADS", "SoftmaxTagger", "CrfTagger", "TAGGERS", "GPLinkerHead"]
