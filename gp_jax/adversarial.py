"""Adversarial training's settings (config group `adversarial`): what `steps.train_step` perturbs and by how much.

A module of its own so that `factory` resolves it into the run spec without importing the jitted steps.
"""

from __future__ import annotations

import dataclasses

ADVERSARIAL_KINDS = ("none", "fgm", "pgd")


@dataclasses.dataclass(frozen=True)
class Adversarial:
  """Adversarial training on the word-embedding output (config group `adversarial`).

  fgm: r = epsilon * g / ||g||, g the clean loss's gradient w.r.t. the embedding output (Miyato et al. 2017).
  pgd: r_0 = 0, r_t = Proj(r_{t-1} + alpha * g_{t-1} / ||g_{t-1}||) for t = 1..steps, g_0 the clean gradient and
       g_t the gradient at r_t; Proj scales r back onto ||r|| <= epsilon when it leaves the ball (Madry et al.
       2018, the `PGD` class of the public GlobalPointer/BERT competition code: K attack steps, loss at r_K).
  ||.|| is the L2 norm over the whole batch's embedding output; a zero gradient gives a zero step.
  The adversarial passes see the clean pass's dropout masks. Costs 2 forward/backward passes (fgm) or
  steps + 1 (pgd; the steps - 1 inner ones take gradients w.r.t. the embedding output only)."""

  kind: str  # "fgm" | "pgd"
  epsilon: float  # radius: ||r|| = epsilon (fgm), <= epsilon (pgd)
  steps: int = 1  # pgd: K
  alpha: float = 0.0  # pgd: step size

  @classmethod
  def from_config(cls, config) -> Adversarial | None:
    """None when off: kind "none" or epsilon 0 (then the step is exactly the plain step)."""
    adv = config.get("adversarial")
    if adv is None:
      return None
    if adv.kind not in ADVERSARIAL_KINDS:
      raise ValueError(f"adversarial.kind must be one of {ADVERSARIAL_KINDS}, got {adv.kind!r}")
    if adv.kind == "none" or float(adv.epsilon) == 0.0:
      return None
    if float(adv.epsilon) < 0 or (adv.kind == "pgd" and (int(adv.steps) < 1 or float(adv.alpha) <= 0)):
      raise ValueError(f"adversarial: epsilon must be >= 0, and pgd needs steps >= 1 and alpha > 0; got {dict(adv)}")
    return cls(adv.kind, float(adv.epsilon), int(adv.steps), float(adv.alpha))
