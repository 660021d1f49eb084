"""A change of batch size mid-run (``cbs_jax.batch_switch``): Adam's second
moment rescaled for the new batch against an Adam run started fresh at that
batch, on a toy problem whose gradient noise is known; the learning-rate
ramp; the trainer's switch step."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from cbs_jax import batch_switch
from cbs_jax import config as config_lib
from cbs_jax import noise_tracker
from cbs_jax import run_state
from cbs_jax import train
from cbs_jax import updater as updater_lib

B1, B2 = 0.9, 0.99


def _adam_run(G, sigma, batches, seed):
  """optax.adam on a linear loss (the gradient does not depend on the
  parameters): step t sees G + sigma * xi / sqrt(batches[t]). A batch entry
  ``("switch", scale)`` rescales nu, ``("switch", scale, mu_scale)`` nu and
  mu, instead of stepping. Returns the updates [T, D] and the opt state at
  each step."""
  rng = np.random.default_rng(seed)
  tx = optax.adam(1e-3, b1=B1, b2=B2, eps=1e-12)
  params = jnp.zeros(G.shape)
  state = tx.init(params)
  step = jax.jit(lambda g, s: tx.update(g, s, params))
  ups, nus = [], []
  for b in batches:
    if isinstance(b, tuple):
      state = batch_switch.rescale_moments(state, *b[1:])
      continue
    g = G + sigma * rng.standard_normal(G.shape) / np.sqrt(b)
    u, state = step(jnp.asarray(g, jnp.float32), state)
    ups.append(np.asarray(u))
    nus.append(np.asarray(state[0].nu))
  return np.array(ups), np.array(nus)


def _rms(x):
  return float(np.sqrt(np.mean(np.square(x))))


@pytest.mark.parametrize(
    "rho2, b_old, b_new",
    [
        (4000.0, 256, 4096),  # noise-dominated before, mixed after (B' ~ B_noise)
        (4000.0, 4096, 256),  # a shrink
        (300.0, 64, 2048),  # |G|^2 dominates after the switch
    ],
)
def test_rescaled_adam_matches_a_fresh_run_at_the_new_batch(rho2, b_old, b_new):
  """Every coordinate with the same noise-to-signal ratio sigma_i^2 / G_i^2 =
  rho2 (so B_noise = rho2 exactly, and the global share is each
  coordinate's): after 500 steps at b_old and a switch, nu and the update
  size over updates 20-60 (momentum refreshed, nu not yet: b2 = 0.99) match
  a run that has been at b_new for 500 steps within 5%; without the
  rescaling they are off by more than 20%."""
  rng = np.random.default_rng(0)
  G = rng.normal(size=400) * rng.uniform(0.2, 2.0, 400)
  sigma = np.sqrt(rho2) * np.abs(G)
  scale = batch_switch.nu_scale(b_old, b_new, rho2)
  warm, after = [b_old] * 500, [b_new] * 60
  fresh_u, fresh_nu = _adam_run(G, sigma, [b_new] * 560, seed=1)
  sw_u, sw_nu = _adam_run(G, sigma, warm + [("switch", scale)] + after, seed=2)
  no_u, no_nu = _adam_run(G, sigma, warm + after, seed=2)
  ref_nu = np.mean(fresh_nu[500:], axis=0)
  nu_err = lambda nu: abs(np.mean(np.mean(nu[500:501], axis=0) / ref_nu) - 1)
  assert nu_err(sw_nu) < 0.05
  assert nu_err(no_nu) > 0.2
  step_ratio = lambda u: _rms(u[520:560]) / _rms(fresh_u[520:560])
  assert step_ratio(sw_u) == pytest.approx(1.0, abs=0.05)
  assert abs(step_ratio(no_u) - 1) > 0.2


def test_rescaling_in_the_noise_dominated_limit_with_mixed_coordinates():
  """Coordinates with different noise-to-signal ratios, all with
  B_noise_i >> B: the share is ~1 everywhere and nu scales by B / B'
  (within 10% against the fresh run)."""
  rng = np.random.default_rng(3)
  G = rng.normal(size=400) * 0.01
  sigma = rng.uniform(0.5, 2.0, 400)  # sigma^2 / G^2 ~ 10^4 x ... >> B
  b_old, b_new = 32, 512
  scale = batch_switch.nu_scale(b_old, b_new, None)
  assert scale == b_old / b_new
  fresh_u, _ = _adam_run(G, sigma, [b_new] * 560, seed=4)
  sw_u, _ = _adam_run(G, sigma, [b_old] * 500 + [("switch", scale)] + [b_new] * 60, seed=5)
  assert _rms(sw_u[520:560]) / _rms(fresh_u[520:560]) == pytest.approx(1.0, abs=0.1)


def test_nu_scale_limits_and_bad_input():
  assert batch_switch.nu_scale(100, 400, 1e12) == pytest.approx(0.25)  # pure noise
  assert batch_switch.nu_scale(100, 400, 0.0) == 1.0  # no noise
  assert batch_switch.nu_scale(100, 400, float("inf")) == 0.25  # not finite: noise-dominated
  # exact for one coordinate: E g^2 = G^2 + s^2 / B with B_noise = s^2 / G^2
  G2, s2 = 0.3, 900.0
  want = (G2 + s2 / 400) / (G2 + s2 / 100)
  assert batch_switch.nu_scale(100, 400, s2 / G2) == pytest.approx(want)
  with pytest.raises(ValueError, match="> 0"):
    batch_switch.nu_scale(0, 4, 1.0)


@pytest.mark.parametrize("b_old, b_new", [(256, 4096), (4096, 256)])
def test_rescaled_first_moment_makes_the_first_steps_match_a_fresh_run(b_old, b_new):
  """Noise-dominated (|G|^2 negligible against sigma^2 / B): Adam's step
  m / sqrt(nu) then has the same distribution at every B, so the first
  updates after a switch with mu and nu both rescaled match a run that has
  been at b_new all along (RMS over 2,048 coordinates and the first 5
  updates, within 10%); with nu alone they are off toward sqrt(b_new / b_old),
  the first moment's old noise over the new second moment (by less as
  new gradients mix in)."""
  D = 2048
  G = np.full(D, 1e-4, np.float32)
  sigma = np.ones(D, np.float32)
  scale = batch_switch.nu_scale(b_old, b_new, None)
  warm = [b_old] * 500
  after = [b_new] * 5
  both, _ = _adam_run(G, sigma, warm + [("switch", scale, np.sqrt(scale))] + after, seed=1)
  nu_only, _ = _adam_run(G, sigma, warm + [("switch", scale)] + after, seed=1)
  fresh, _ = _adam_run(G, sigma, [b_new] * 505, seed=2)
  want = _rms(fresh[-5:])
  assert _rms(both[-5:]) == pytest.approx(want, rel=0.10)
  ratio = _rms(nu_only[-5:]) / want  # off toward sqrt(b_new / b_old) (4 or 1/4), by > 1.3x
  assert np.sign(np.log(ratio)) == np.sign(np.log(b_new / b_old)) and abs(np.log(ratio)) > np.log(
      1.3
  )


@pytest.mark.parametrize("mu_scale", [1.0, 0.25])
def test_rescale_moments_scales_each_moment_by_its_own_factor(mu_scale):
  params = {"a": jnp.ones((3,)), "b": jnp.ones((2, 2))}
  tx = optax.chain(optax.clip_by_global_norm(1.0), optax.adamw(1e-3))
  state = tx.init(params)
  _, state = tx.update(jax.tree.map(jnp.ones_like, params), state, params)
  out = batch_switch.rescale_moments(state, 0.5, mu_scale)
  adam_in, adam_out = state[1][0], out[1][0]
  for a, b in zip(jax.tree.leaves(adam_in.nu), jax.tree.leaves(adam_out.nu)):
    np.testing.assert_array_equal(np.asarray(b), 0.5 * np.asarray(a))
  for a, b in zip(jax.tree.leaves(adam_in.mu), jax.tree.leaves(adam_out.mu)):
    np.testing.assert_array_equal(np.asarray(b), mu_scale * np.asarray(a))
  assert int(adam_out.count) == int(adam_in.count)


def test_ramp_goes_linearly_from_the_old_rate_to_the_new():
  lrs = [batch_switch.ramp(s, 10, 1.0, 3.0, 4) for s in range(10, 16)]
  assert lrs == pytest.approx([1.5, 2.0, 2.5, 3.0, 3.0, 3.0])
  assert batch_switch.ramp(10, 10, 1.0, 3.0, 0) == 3.0


@pytest.mark.parametrize("rescale_mu", [False, True])
def test_switch_batch_rescales_nu_with_the_trackers_b_noise_and_starts_the_ramp(rescale_mu):
  c = config_lib.base_config()
  c.batch.rollouts_per_prompt = 16
  c.batch.adaptive_rescale_mu = rescale_mu
  params = {"w": jnp.ones((4,))}
  tx = updater_lib.make_optimizer(c.optim)
  opt = tx.init(params)
  _, opt = tx.update({"w": jnp.ones((4,))}, opt, params)
  ema = noise_tracker.NoiseEMA(0.5)
  rng = np.random.default_rng(0)
  for _ in range(30):  # B_noise ~ 1,000 rollouts, resolved
    u = lambda: 1 + 0.05 * rng.uniform(-1, 1)
    ema.update(dict(trace_intra=600 * u(), trace_inter=400 / 16 * u(), g2=u()), 16, 16)
  iv = ema.interval(c.batch.adaptive_z)
  assert iv["resolved"]
  state = run_state.RunState(
      params=params,
      opt_state=opt,
      history=[],
      counters=run_state.Counters(step=7, lr=2e-4),
      noise=ema,
      noise_adam=noise_tracker.NoiseEMA(0.5),
      controller=None,
      log=run_state.RunLog(),
  )
  nu0 = np.asarray(train.gradstats.adam_state(opt).nu["w"])
  mu0 = np.asarray(train.gradstats.adam_state(opt).mu["w"])
  fields = train.switch_batch(c, state, 16, 64)
  want = batch_switch.nu_scale(256, 1024, iv["b_noise"])
  assert fields["adaptive/nu_scale"] == pytest.approx(want)
  np.testing.assert_allclose(
      np.asarray(train.gradstats.adam_state(state.opt_state).nu["w"]), want * nu0, rtol=1e-6
  )
  mu_want = np.sqrt(want) if rescale_mu else 1.0
  assert fields.get("adaptive/mu_scale", 1.0) == pytest.approx(mu_want)
  np.testing.assert_allclose(
      np.asarray(train.gradstats.adam_state(state.opt_state).mu["w"]), mu_want * mu0, rtol=1e-6
  )
  assert state.counters.switch_step == 7 and state.counters.switch_lr_from == 2e-4
