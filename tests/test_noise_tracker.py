"""Tests for cbs_jax.noise_tracker: the EMA tracker's bias correction, ratio
of EMAs, skipped updates and checkpoints (its interval: tests/test_adaptive.py)."""

import pytest

from cbs_jax import noise_tracker


def test_ema_bias_corrected_constant():
  ema = noise_tracker.NoiseEMA(decay=0.9)
  est = dict(trace_intra=7.3, trace_inter=1.1, g2=0.37)
  first = ema.update(est, 8, 4)
  assert first.trace_intra == 7.3 and first.trace_inter == 1.1 and first.g2 == 0.37
  for _ in range(20):
    st = ema.update(est, 8, 4)
    for k, v in est.items():
      assert getattr(st, k) == pytest.approx(v, rel=1e-12)


def test_ema_is_ratio_of_emas_and_checkpoints():
  beta = 0.8
  xs = [
      dict(trace_intra=1.0, trace_inter=0.5, g2=1.0),
      dict(trace_intra=9.0, trace_inter=0.1, g2=0.1),
      dict(trace_intra=2.0, trace_inter=2.0, g2=4.0),
  ]
  ema = noise_tracker.NoiseEMA(decay=beta)
  for x in xs:
    st = ema.update(x, 8, 4)

  # Standard bias-corrected EMA by hand.
  def bc_ema(vals):
    e = 0.0
    for v in vals:
      e = beta * e + (1 - beta) * v
    return e / (1 - beta ** len(vals))

  num = bc_ema([x["trace_intra"] for x in xs])
  den = bc_ema([x["g2"] for x in xs])
  assert st.b_intra == pytest.approx(num / den, rel=1e-12)
  ema_of_ratios = bc_ema([x["trace_intra"] / x["g2"] for x in xs])
  assert abs(st.b_intra - ema_of_ratios) > 1.0
  # Non-finite updates are skipped and flagged.
  skipped = ema.update(dict(trace_intra=float("nan"), trace_inter=1.0, g2=1.0), 8, 4)
  assert "skipped" in skipped.flag and skipped.b_intra == pytest.approx(st.b_intra)
  # Checkpoint round trip through plain floats.
  sd = ema.state_dict()
  assert all(isinstance(v, float) for v in sd.values())
  other = noise_tracker.NoiseEMA()
  other.load_state_dict(sd)
  nxt = dict(trace_intra=3.0, trace_inter=0.2, g2=0.5)
  a, b = ema.update(nxt, 8, 4), other.update(nxt, 8, 4)
  for k in ("g2", "trace_intra", "trace_inter", "b_noise", "n_batches"):
    assert getattr(a, k) == getattr(b, k)


def test_ema_checks_its_input():
  est = dict(trace_intra=1.0, trace_inter=1.0, g2=1.0)
  with pytest.raises(ValueError, match="K=1"):
    noise_tracker.NoiseEMA().update(est, 4, 1)
  with pytest.raises(KeyError, match="NoiseEMA needs"):
    noise_tracker.NoiseEMA().update(dict(trace_total=1.0, g2=1.0), 4, 4)
  with pytest.raises(ValueError, match="decay=1.0"):
    noise_tracker.NoiseEMA(1.0)


def test_the_adam_metric_tracker_starts_after_adams_memory(monkeypatch):
  """train.update_trackers feeds the raw tracker from the first round and the
  Adam-metric tracker only from optimizer step ceil(1 / (1 - b2)) on."""
  from cbs_jax import config as config_lib  # pylint: disable=import-outside-toplevel
  from cbs_jax import gradstats  # pylint: disable=import-outside-toplevel
  from cbs_jax import noise  # pylint: disable=import-outside-toplevel
  from cbs_jax import run_state  # pylint: disable=import-outside-toplevel
  from cbs_jax import train  # pylint: disable=import-outside-toplevel
  from cbs_jax import updater  # pylint: disable=import-outside-toplevel

  est = dict(trace_intra=300.0, trace_inter=5.0, g2=1.0)
  monkeypatch.setattr(gradstats, "sum_leaves", lambda m, *a: m)
  monkeypatch.setattr(noise, "split_estimates", lambda m: dict(est))
  c = config_lib.base_config()
  c.optim.b2 = 0.95
  assert updater.adam_metric_warmup(0.95) == 20 and updater.adam_metric_warmup(0.99) == 100
  state = run_state.RunState(
      params=None,
      opt_state=None,
      history=[],
      counters=run_state.Counters(),
      noise=noise_tracker.NoiseEMA(0.9),
      noise_adam=noise_tracker.NoiseEMA(0.9),
      controller=None,
      log=run_state.RunLog(),
  )
  for step in range(25):
    state.counters.step = step
    row = train.update_trackers(c, state, {"split": "m", "split_adam": "m"}, 16)
    assert "noise_split_adam/g2" in row
    assert ("noise_ema_adam/g2" in row) == (step >= 20)
  assert state.noise.count == 25 and state.noise_adam.count == 5
