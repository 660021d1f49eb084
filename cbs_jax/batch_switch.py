"""What the optimizer does when the batch size changes mid-run.

Two things go stale when the adaptive controller moves from B to B'
rollouts per update (docs/batch_law.md, "Switching the batch size"):

* **Adam's second moment.** nu is an EMA of the squared minibatch gradient,
  E[g_i^2] = G_i^2 + sigma_i^2 / B per coordinate. At B' the same
  coordinate has G_i^2 + sigma_i^2 / B'. With the noise share of nu taken
  from the tracker's noise scale, sigma^2 / B over G^2 + sigma^2 / B equal
  to B_noise / (B_noise + B) (tr Sigma / |G|^2 in the place of each
  coordinate's own ratio), the rescaling is

      nu' = nu * [B (B' + B_noise)] / [B' (B + B_noise)]     (``nu_scale``)

  which is B / B' when noise dominates (B << B_noise) and 1 when it does
  not (B >> B_noise). Without it nu keeps the old batch's noise for
  ~1 / (1 - b2) steps, and Adam's step is off by about sqrt(B' / B) (too
  small after a growth) while the learning rate rule already scaled it.
  The first moment's expectation is G at any B, but its noise is not:
  mu's variance is (1 - b1) / (1 + b1) sigma^2 / B, so right after a
  growth mu still carries the old, larger noise while nu has been scaled
  down, and m / sqrt(nu) -- Adam's step -- is ~sqrt(B' / B) times its
  steady size at B' for ~1 / (1 - b1) updates. ``adaptive_rescale_mu``
  scales mu by sqrt(nu_scale) as well (exact in the noise-dominated limit,
  where both moments' noise shares scale as 1 / B): the step right after
  the switch equals the step before it, and the learning-rate ramp alone
  moves it to the new batch's. The signal share of mu shrinks with it and
  is rebuilt within ~1 / (1 - b1) updates.
* **The learning rate.** The rule (``lr_rules.lr_scale``) gives the new
  rate; ``ramp`` moves to it linearly over ``steps`` updates from the old
  one, as a warmup from the rate the optimizer was stable at.
"""

from __future__ import annotations

import math

import jax
import optax


def nu_scale(b_old: float, b_new: float, b_noise: float | None) -> float:
  """The factor on Adam's nu for a change from ``b_old`` to ``b_new``
  rollouts per update; ``b_noise`` (rollouts, at the run's K) None or not
  finite: noise-dominated, b_old / b_new."""
  if not (b_old > 0 and b_new > 0):
    raise ValueError(f"batch sizes must be > 0, got {b_old}, {b_new}")
  if b_noise is None or not math.isfinite(b_noise) or b_noise < 0:
    return b_old / b_new
  return b_old * (b_new + b_noise) / (b_new * (b_old + b_noise))


def rescale_moments(opt_state, scale: float, mu_scale: float = 1.0):
  """``opt_state`` with every ``optax.ScaleByAdamState``'s nu times
  ``scale`` and mu times ``mu_scale`` (the step count unchanged)."""
  is_adam = lambda x: isinstance(x, optax.ScaleByAdamState)

  def fix(x):
    if is_adam(x):
      return x._replace(
          mu=jax.tree.map(lambda v: v * mu_scale, x.mu),
          nu=jax.tree.map(lambda v: v * scale, x.nu),
      )
    return x

  return jax.tree.map(fix, opt_state, is_leaf=is_adam)


def ramp(step: int, switch_step: int, lr_old: float, lr_new: float, steps: int) -> float:
  """The learning rate of optimizer step ``step`` (0-based) after a switch
  at ``switch_step`` (the first update at the new batch): linear from
  ``lr_old`` to ``lr_new`` over ``steps`` updates (reaching it at update
  ``steps``); ``steps`` 0 jumps."""
  k = step - switch_step
  if steps <= 0 or k >= steps - 1:
    return lr_new
  w = (k + 1) / steps
  return lr_old + (lr_new - lr_old) * max(w, 0.0)
