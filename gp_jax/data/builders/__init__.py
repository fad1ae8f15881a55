"""TFDS builders, one module per corpus (registered as gp_<name> to avoid TFDS's own).

Importing a module here imports tensorflow_datasets (not TensorFlow); `gp_jax.data.corpora`
imports them lazily.
"""

# Public corpus name -> (module, builder class).
BUILDERS = {
    "msra": ("gp_jax.data.builders.msra", "GpMsra"),
    "cluener2020": ("gp_jax.data.builders.cluener2020", "GpCluener2020"),
    "conll2003": ("gp_jax.data.builders.conll2003", "GpConll2003"),
    "germeval2014": ("gp_jax.data.builders.germeval2014", "GpGermeval2014"),
    "people_daily": ("gp_jax.data.builders.people_daily", "GpPeopleDaily"),
    "cmeee": ("gp_jax.data.builders.cmeee", "GpCmeee"),
    "cmeee_v2": ("gp_jax.data.builders.cmeee", "GpCmeeeV2"),
    "webnlg_star": ("gp_jax.data.builders.webnlg_star", "GpWebnlgStar"),
    "phee": ("gp_jax.data.builders.phee", "GpPhee"),
}
