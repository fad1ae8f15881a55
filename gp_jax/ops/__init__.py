"""Pure jax.numpy ops: RoPE, span scores, masks, ZLPR losses (dense, sparse, blockwise; the blockwise loss also as
Pallas kernels, `pallas_zlpr`), decoding (spans; GPLinker's relation hits, its triples assembled on the host), CRF,
and the 2-D matmul the models' Linear layers use."""

from gp_jax.ops.blockwise import blockwise_decode_hits, blockwise_zlpr_loss
from gp_jax.ops.crf import crf_log_partition, crf_sequence_score, viterbi_decode
from gp_jax.ops.decode import decode_hits, gather_hits
from gp_jax.ops.linear import flat_dot_general
from gp_jax.ops.losses import sparse_zlpr_loss, zlpr_loss
from gp_jax.ops.relations import TRIPLE_COLUMNS, assemble_triples, grown_sizes, relation_hits
from gp_jax.ops.rope import apply_rope
from gp_jax.ops.spans import masked_fill_value, span_mask, span_scores

__all__ = [
    "apply_rope",
    "flat_dot_general",
    "span_scores",
    "span_mask",
    "masked_fill_value",
    "zlpr_loss",
    "sparse_zlpr_loss",
    "decode_hits",
    "gather_hits",
    "relation_hits",
    "grown_sizes",
    "assemble_triples",
    "TRIPLE_COLUMNS",
    "blockwise_zlpr_loss",
    "blockwise_decode_hits",
    "crf_log_partition",
    "crf_sequence_score",
    "viterbi_decode",
]
