"""Errors that are the user's, not the code's: `gp_jax.main` prints them as one line and exits 2.

A bad config (an experiment refusing a dataset, an unknown arg), a bad data file (`readers.DataError` names
file:line or file and record index) and a missing corpus file raise `UserError`; anything else is a bug and
keeps its traceback. A subclass of ValueError, so callers that catch ValueError still do.
"""


class UserError(ValueError):
  """A mistake in the config or the data the user gave; the message says what and where, in one line."""
