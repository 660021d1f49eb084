"""``RunState`` is the checkpoint: it round-trips through one exactly."""

import dataclasses
import math

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from cbs_jax import checkpoint as ckpt_lib
from cbs_jax import controller
from cbs_jax import noise_tracker
from cbs_jax import run_state


def _state(decay=0.9, moved=True):
  params = {"w": jnp.arange(6.0).reshape(2, 3), "b": jnp.array([0.5, -1.0], jnp.bfloat16)}
  tx = optax.adam(1e-3)
  opt_state = tx.init(params)
  _, opt_state = tx.update(jax.tree.map(jnp.ones_like, params), opt_state, params)
  ema, ema_adam = noise_tracker.NoiseEMA(decay), noise_tracker.NoiseEMA(decay)
  rng = np.random.default_rng(0)
  for _ in range(5):
    ema.update(
        dict(
            trace_intra=rng.uniform(90, 110),
            trace_inter=rng.uniform(1, 2),
            g2=rng.uniform(0.5, 1.5),
        ),
        8,
        4,
    )
    ema_adam.update(dict(trace_intra=1.0, trace_inter=0.1, g2=0.2), 8, 4)
  ctl = controller.AdaptiveBatch(4, 8, 64, every=2, prompts=8)
  if moved:
    ctl.update(2, dict(value=1000.0, lo=900.0, hi=1100.0, resolved=True))
  log = run_state.RunLog()
  log.evaluations.append(run_state.Evaluation(0, 0, 0.25, sampled=0.2, expected=True))
  log.evaluations.append(run_state.Evaluation(4, 128, 0.5, sampled=None, expected=True))
  log.gen_seconds, log.update_seconds = 1.25, 2.5
  log.add_split(100.0, 1.5, 0.75)
  log.add_split(101.0, 1.25, float("nan"))  # not a number: left out
  return run_state.RunState(
      params=params,
      opt_state=opt_state,
      history=[jax.tree.map(lambda x: x + 1, params)],
      counters=run_state.Counters(
          round=4, step=8, rollouts_seen=128, skipped_updates=1, seconds=3.5, base_pass_rate=0.25
      ),
      noise=ema,
      noise_adam=ema_adam,
      controller=ctl,
      log=log,
  )


def _fresh(saved: run_state.RunState) -> run_state.RunState:
  """What start_run builds before a restore: same shapes, fresh records."""
  zero = jax.tree.map(jnp.zeros_like, saved.arrays())
  return run_state.RunState(
      params=zero["params"],
      opt_state=zero["opt_state"],
      history=zero["history"],
      counters=run_state.Counters(),
      noise=noise_tracker.NoiseEMA(saved.noise.decay),
      noise_adam=noise_tracker.NoiseEMA(saved.noise.decay),
      controller=controller.AdaptiveBatch(4, 8, 64, every=2, prompts=8),
      log=run_state.RunLog(),
  )


def test_run_state_round_trips_through_a_checkpoint(tmp_path):
  saved = _state()
  assert saved.controller.prompts != 8  # the controller moved: its state matters
  assert len(saved.log.split) == 1
  ck = ckpt_lib.Checkpointer(str(tmp_path / "checkpoints"))
  run_state.save(ck, saved, {"d_model": 32})
  assert ck.latest_step() == 4
  assert ck.read_meta()["model"] == {"d_model": 32}
  got = run_state.restore(ck, 4, _fresh(saved))
  ck.close()
  for a, b in zip(jax.tree.leaves(saved.arrays()), jax.tree.leaves(got.arrays())):
    assert a.dtype == b.dtype and np.array_equal(
        np.asarray(a, np.float32), np.asarray(b, np.float32)
    )
  assert jax.tree.structure(saved.arrays()) == jax.tree.structure(got.arrays())
  assert got.counters == saved.counters
  assert got.log == saved.log
  assert got.noise.state_dict() == saved.noise.state_dict()
  assert got.noise_adam.state_dict() == saved.noise_adam.state_dict()
  assert got.noise.interval(2.0) == saved.noise.interval(2.0)
  assert got.controller.state_dict() == saved.controller.state_dict()
  assert got.controller.prompts == saved.controller.prompts


def test_run_state_is_a_pytree_of_its_arrays():
  s = _state()
  leaves = jax.tree.leaves(s)
  assert len(leaves) == len(jax.tree.leaves(s.arrays()))
  doubled = jax.tree.map(lambda x: x * 2, s)
  assert isinstance(doubled, run_state.RunState)
  assert float(doubled.params["w"][1, 2]) == 10.0
  assert doubled.counters is s.counters  # the host records travel as they are


def test_a_checkpoint_from_before_the_typed_state_is_refused_by_name(tmp_path):
  s = _state()
  ck = ckpt_lib.Checkpointer(str(tmp_path / "checkpoints"))
  ck.save(3, s.arrays(), {"round": 3, "step": 6, "model": {}})  # the old flat meta
  with pytest.raises(ckpt_lib.CheckpointError, match="before the typed run state"):
    run_state.restore(ck, 3, _fresh(s))
  ck.close()


def test_counters_and_log_are_plain_json():
  s = _state()
  rec = s.records()
  assert rec["counters"]["round"] == 4 and rec["counters"]["stopped_at_target"] is False
  assert run_state.RunLog.from_json(rec["log"]) == s.log
  assert all(math.isfinite(e["g2"]) for e in rec["log"]["split"])
  assert run_state.Counters(**dataclasses.asdict(s.counters)) == s.counters
