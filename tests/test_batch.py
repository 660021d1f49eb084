"""Learning-rate rules, the steps-to-target law and the adaptive controller."""

import numpy as np
import pytest

from cbs_jax import batch_law
from cbs_jax import controller
from cbs_jax import lr_rules
from cbs_jax import noise_tracker


def test_lr_rules_closed_form():
  assert lr_rules.lr_scale("constant", 1024, 256) == 1.0
  assert lr_rules.lr_scale("sqrt", 1024, 256) == pytest.approx(2.0)
  assert lr_rules.lr_scale("linear", 64, 256) == pytest.approx(0.25)
  with pytest.raises(ValueError, match="lr_rule"):
    lr_rules.lr_scale("cubic", 1, 1)
  with pytest.raises(ValueError, match="n=0"):
    lr_rules.lr_scale("sqrt", 0, 1)
  assert [lr_rules.warmup(s, 4) for s in range(5)] == [0.25, 0.5, 0.75, 1.0, 1.0]


def test_steps_to_target_interpolates_the_first_crossing():
  steps = [0, 10, 20, 30]
  vals = [0.40, 0.50, 0.70, 0.60]
  # crosses 0.6 between (10, 0.5) and (20, 0.7): 10 + 0.1 * 10 / 0.2 = 15
  assert batch_law.steps_to_target(steps, vals, 0.6) == pytest.approx(15.0)
  assert batch_law.steps_to_target(steps, vals, 0.3) == 0.0
  assert batch_law.steps_to_target(steps, vals, 0.9) is None


def test_adaptive_controller_buckets_and_holds_on_unresolved_noise():
  c = controller.AdaptiveBatch(K=16, min_prompts=8, max_prompts=128, factor=1.0, every=5)
  assert c.buckets == [8, 16, 32, 64, 128]
  assert c.update(0, 5000.0) == 8  # no decision at round 0
  assert c.update(5, 1000.0) == 64  # 1000/16 = 62.5 -> nearest bucket 64
  assert c.update(7, 50.0) == 64  # only every 5 rounds
  assert c.update(10, float("nan")) == 64  # unresolved: keep
  assert c.update(15, 100000.0) == 128  # clipped to max
  assert c.update(20, 16.0) == 8  # 1 prompt -> min
  c2 = controller.AdaptiveBatch(K=8, min_prompts=4, max_prompts=64, factor=2.0, every=1)
  assert c2.update(1, 200.0) == 64  # 2*200/8 = 50 -> 64
  with pytest.raises(ValueError, match="min_prompts"):
    controller.AdaptiveBatch(K=8, min_prompts=16, max_prompts=8)
  with pytest.raises(ValueError, match="hysteresis"):
    controller.AdaptiveBatch(K=8, min_prompts=4, max_prompts=8, hysteresis=0.5)


def test_buckets_are_min_times_powers_of_two_up_to_max():
  assert controller.buckets(8, 256) == [8, 16, 32, 64, 128, 256]
  assert controller.buckets(3, 40) == [3, 6, 12, 24]  # max need not be a bucket
  assert controller.buckets(5, 5) == [5]
  assert controller.AdaptiveBatch(16, 2, 8).buckets == [2, 4, 8]
  with pytest.raises(ValueError, match="min_prompts <= max_prompts, got 16, 8"):
    controller.buckets(16, 8)
  with pytest.raises(ValueError, match="got 0, 8"):
    controller.buckets(0, 8)


def _interval(b, lo, hi, resolved=True):
  return dict(b_noise=b, lo=lo, hi=hi, resolved=resolved)


def test_adaptive_controller_moves_only_on_resolved_changes():
  c = controller.AdaptiveBatch(K=16, min_prompts=8, max_prompts=256, every=1, prompts=32)
  # the interval straddles the current bucket's widened range: hold
  assert c.update(1, _interval(32 * 16 * 1.5, 32 * 16 * 0.9, 32 * 16 * 2.5)) == 32
  # an unresolved interval never moves, whatever its point estimate
  assert c.update(2, _interval(1e6, 0.0, float("inf"), resolved=False)) == 32
  # the whole interval is far above: move to the bucket nearest the estimate
  assert c.update(3, _interval(128 * 16, 100 * 16, 160 * 16)) == 128
  assert c.changes == 1


def _tracker_run(true_b, rounds, noise_frac, seed, K=16, P=16, every=10, decay=0.95):
  """Feed a NoiseEMA per-round estimates with i.i.d. relative noise around a
  B_noise trajectory; the controller reads its interval."""
  rng = np.random.default_rng(seed)
  ema = noise_tracker.NoiseEMA(decay)
  ctl = controller.AdaptiveBatch(K=K, min_prompts=4, max_prompts=512, every=every, prompts=P)
  chosen = []
  for t in range(rounds):
    g2 = 1.0
    tr = true_b(t) * g2  # trace_intra + K trace_inter at g2 = 1 (trace_inter = 0)
    est = dict(
        trace_intra=tr * (1 + noise_frac * rng.uniform(-1, 1)),
        trace_inter=0.0,
        g2=g2 * (1 + noise_frac * rng.uniform(-1, 1)),
    )
    chosen.append(ctl.update(t, ema.interval(2.0)))
    ema.update(est, P, K)
  return chosen, ctl


# the controller on noisy flat / rising / falling trajectories of every signal,
# through the trainer's choose_prompts: tests/test_adaptive.py


def test_adaptive_state_restore_continues_the_schedule():
  full, _ = _tracker_run(lambda t: 256.0 * 2 ** (t / 40), 200, 0.3, 2)
  # replay: stop at round 100, save both states, restore into new objects
  rng = np.random.default_rng(2)
  ema, ctl = noise_tracker.NoiseEMA(0.95), controller.AdaptiveBatch(
      16, 4, 512, every=10, prompts=16
  )
  chosen = []
  for t in range(200):
    if t == 100:
      e_state, c_state = ema.state_dict(), ctl.state_dict()
      ema, ctl = noise_tracker.NoiseEMA(0.5), controller.AdaptiveBatch(
          16, 4, 512, every=10, prompts=4
      )
      ema.load_state_dict(e_state)
      ctl.load_state_dict(c_state)
    tr = 256.0 * 2 ** (t / 40)
    est = dict(
        trace_intra=tr * (1 + 0.3 * rng.uniform(-1, 1)),
        trace_inter=0.0,
        g2=1 + 0.3 * rng.uniform(-1, 1),
    )
    chosen.append(ctl.update(t, ema.interval(2.0)))
    ema.update(est, 16, 16)
  assert chosen == full


def test_tracker_interval_covers_a_fixed_b_noise():
  """Coverage of the EMA interval for a constant B_noise (independent per-round
  estimates): the +-2 SE interval contains the truth most of the time."""
  covered = 0
  for seed in range(200):
    rng = np.random.default_rng(seed)
    ema = noise_tracker.NoiseEMA(0.9)
    for _ in range(60):
      ema.update(
          dict(
              trace_intra=400 * (1 + 0.5 * rng.standard_normal()),
              trace_inter=10 * (1 + 0.5 * rng.standard_normal()),
              g2=1 + 0.5 * rng.standard_normal(),
          ),
          16,
          16,
      )
    iv = ema.interval(2.0)
    covered += iv["resolved"] and iv["lo"] <= 560 <= iv["hi"]
  assert 0.85 <= covered / 200 <= 1.0
