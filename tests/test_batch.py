"""Batch-size rules and the steps/samples-to-target law."""

import numpy as np
import pytest

from cbs_jax import batch


def test_lr_rules_closed_form():
  assert batch.lr_scale("constant", 1024, 256) == 1.0
  assert batch.lr_scale("sqrt", 1024, 256) == pytest.approx(2.0)
  assert batch.lr_scale("linear", 64, 256) == pytest.approx(0.25)
  with pytest.raises(ValueError, match="lr_rule"):
    batch.lr_scale("cubic", 1, 1)
  with pytest.raises(ValueError, match="n=0"):
    batch.lr_scale("sqrt", 0, 1)
  assert [batch.warmup(s, 4) for s in range(5)] == [0.25, 0.5, 0.75, 1.0, 1.0]


def test_steps_to_target_interpolates_the_first_crossing():
  steps = [0, 10, 20, 30]
  vals = [0.40, 0.50, 0.70, 0.60]
  # crosses 0.6 between (10, 0.5) and (20, 0.7): 10 + 0.1 * 10 / 0.2 = 15
  assert batch.steps_to_target(steps, vals, 0.6) == pytest.approx(15.0)
  assert batch.steps_to_target(steps, vals, 0.3) == 0.0
  assert batch.steps_to_target(steps, vals, 0.9) is None


def test_fit_critical_batch_recovers_the_law():
  s_min, b_crit = 120.0, 700.0
  n = np.array([64, 128, 256, 512, 1024, 2048])
  s = s_min * (1 + b_crit / n)
  fit = batch.fit_critical_batch(n, s)
  assert fit["S_min"] == pytest.approx(s_min) and fit["B_crit"] == pytest.approx(b_crit)
  assert fit["E_min"] == pytest.approx(s_min * b_crit) and fit["r2"] == pytest.approx(1.0)
  # the hyperbola (S/S_min - 1)(E/E_min - 1) = 1 holds at every N
  e = n * s
  assert np.allclose((s / fit["S_min"] - 1) * (e / fit["E_min"] - 1), 1.0)
  with pytest.raises(ValueError, match="distinct"):
    batch.fit_critical_batch([64, 64], [1, 2])


def test_adaptive_controller_buckets_and_holds_on_unresolved_noise():
  c = batch.AdaptiveBatch(K=16, min_prompts=8, max_prompts=128, factor=1.0, every=5)
  assert c.buckets == [8, 16, 32, 64, 128]
  assert c.update(0, 5000.0) == 8          # no decision at round 0
  assert c.update(5, 1000.0) == 64         # 1000/16 = 62.5 -> bucket 64
  assert c.update(7, 50.0) == 64           # only every 5 rounds
  assert c.update(10, float("nan")) == 64  # unresolved: keep
  assert c.update(15, 100000.0) == 128     # clipped to max
  assert c.update(20, 16.0) == 8           # 1 prompt -> min
  c2 = batch.AdaptiveBatch(K=8, min_prompts=4, max_prompts=64, factor=2.0, every=1)
  assert c2.update(1, 200.0) == 64         # 2*200/8 = 50 -> 64
  with pytest.raises(ValueError, match="min_prompts"):
    batch.AdaptiveBatch(K=8, min_prompts=16, max_prompts=8)
