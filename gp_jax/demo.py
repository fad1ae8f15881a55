"""A small built-in demo: nested spans decoded from hand-set GlobalPointer scores."""

import jax.numpy as jnp
import numpy as np

from gp_jax.ops import decode_spans, span_mask


def main():
  text = "Bank of China Beijing branch"
  words = text.split()
  types = ["ORG", "LOC"]
  L = len(words)
  logits = np.full((1, len(types), L, L), -3.0, np.float32)
  logits[0, 0, 0, 4] = 4.0  # ORG "Bank of China Beijing branch"
  logits[0, 0, 0, 2] = 2.5  # ORG "Bank of China" (nested)
  logits[0, 1, 2, 2] = 1.5  # LOC "China" (nested)
  logits[0, 1, 3, 3] = 3.0  # LOC "Beijing" (nested)
  spans = decode_spans(jnp.asarray(logits), mask=span_mask(jnp.ones((1, L), jnp.int32)), return_scores=True)[0]
  print(f"text: {text}")
  for start, end, type_id, score in spans:
    print(f"  {types[type_id]:4s} [{start},{end}] {' '.join(words[start:end + 1])!r} score={score:.2f}")


if __name__ == "__main__":
  main()
