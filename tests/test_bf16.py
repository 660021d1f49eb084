"""bfloat16 parameters / compute with a float32 optimizer state.

Reference: the same parameters evaluated in float32 (an independent, exact
computation of what bfloat16 approximates); the master-weight optimizer is
checked against plain float32 arithmetic.
"""

import os

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from cbs_jax import config as config_lib
from cbs_jax import model as model_lib
from cbs_jax import precision
from cbs_jax import scoring
from cbs_jax import train
from tests.tiny import tiny_config

# max |log-prob difference| of bf16 params + compute vs float32, over every
# completion token of the batch below (measured ~0.03; bf16 has 8 bits of
# mantissa, so ~0.4% relative error per op)
BF16_LOGPROB_ATOL = 0.1


def _batch(seed=0, B=8, Tp=6, Tc=10, V=20):
  rng = np.random.default_rng(seed)
  prompt = rng.integers(3, V, (B, Tp)).astype(np.int32)
  pmask = np.ones((B, Tp), bool)
  pmask[0, :2] = False
  comp = rng.integers(3, V, (B, Tc)).astype(np.int32)
  cmask = (np.arange(Tc)[None] < rng.integers(3, Tc + 1, (B, 1))).astype(np.float32)
  return prompt, pmask, comp, cmask


@pytest.mark.slow  # ~20 s of CPU
def test_bf16_logprobs_close_to_float32():
  c32 = tiny_config(max_len=32, num_layers=3)
  gd32, p32 = model_lib.build(c32, seed=3)
  c16 = tiny_config(max_len=32, num_layers=3, dtype="bfloat16", param_dtype="bfloat16")
  gd16, _ = model_lib.build(c16, seed=3)
  p16 = precision.cast(p32, jnp.bfloat16)
  assert all(x.dtype == jnp.bfloat16 for x in jax.tree.leaves(p16))
  prompt, pmask, comp, cmask = _batch()
  s32 = scoring.score(gd32, p32, prompt, pmask, comp, cmask, scoring.SamplingSpec())
  s16 = scoring.score(gd16, p16, prompt, pmask, comp, cmask, scoring.SamplingSpec())
  assert s16.logprobs.dtype == jnp.float32 and s16.logits.dtype == jnp.float32
  diff = float(jnp.max(jnp.abs(s16.logprobs - s32.logprobs) * cmask))
  print(f"bf16 vs f32 max |log-prob diff| = {diff:.4f}")
  assert 0 < diff <= BF16_LOGPROB_ATOL


def test_master_weights_keep_updates_bfloat16_would_lose():
  """100 SGD steps of 1e-4 on a weight of 1.0: in bfloat16 (spacing 2^-7 ~
  0.008 near 1) each step rounds away; the float32 master accumulates them
  and the bf16 parameters follow its rounding."""
  params = {"w": jnp.ones((4,), jnp.bfloat16)}
  grads = {"w": jnp.ones((4,), jnp.bfloat16)}
  naive, master = optax.sgd(1e-4), precision.master_weights(optax.sgd(1e-4))
  pn, pm = params, params
  sn, sm = naive.init(pn), master.init(pm)
  assert sm.master["w"].dtype == jnp.float32
  for _ in range(100):
    u, sn = naive.update(grads, sn, pn)
    pn = optax.apply_updates(pn, u)
    u, sm = master.update(grads, sm, pm)
    pm = optax.apply_updates(pm, u)
  assert pn["w"].dtype == pm["w"].dtype == jnp.bfloat16
  np.testing.assert_array_equal(np.asarray(pn["w"], np.float32), 1.0)  # lost
  w = np.float32(1.0)  # the same 100 steps in plain float32 arithmetic
  for _ in range(100):
    w = np.float32(w + np.float32(-1e-4))
  np.testing.assert_array_equal(np.asarray(sm.master["w"]), w)
  assert abs(float(w) - 0.99) < 1e-5
  np.testing.assert_array_equal(
      np.asarray(pm["w"]), np.asarray(sm.master["w"].astype(jnp.bfloat16))
  )


@pytest.mark.slow
def test_bf16_run_keeps_float32_optimizer_state_and_statistics(tmp_path):
  """A short GRPO run with bf16 params + compute: bf16 parameters, float32
  master copy and Adam moments in the checkpoint, finite float32 losses and
  noise statistics."""

  def cfg(dtype):
    from configs import default  # pylint: disable=import-outside-toplevel

    c = default.get_config("smoke")
    c.task.kwargs.max_digits = 1
    c.sft.steps, c.train.num_rounds, c.train.eval_every = 5, 2, 0
    c.train.eval_prompts, c.train.eval_expected = 8, False
    c.model.dtype = c.model.param_dtype = dtype
    return c

  s16 = train.train_and_evaluate(cfg("bfloat16"), str(tmp_path / "bf16"))
  assert s16["rounds"] == 2 and s16["skipped_updates"] == 0
  from cbs_jax import metrics as metrics_lib  # pylint: disable=import-outside-toplevel

  rows = [r for r in metrics_lib.read_jsonl(str(tmp_path / "bf16" / "metrics.jsonl")) if r["round"]]
  for r in rows:
    for k in ("loss", "grad_norm", "entropy", "noise_split/trace_intra", "noise_split/g2"):
      assert r[k] is not None and np.isfinite(r[k]), (k, r[k])
  # the checkpoint holds bf16 params and a float32 optimizer state
  from cbs_jax import checkpoint as ckpt_lib  # pylint: disable=import-outside-toplevel

  c = cfg("bfloat16")
  config_lib.validate(c)
  ck = ckpt_lib.Checkpointer(str(tmp_path / "bf16" / "checkpoints"))
  meta = ck.read_meta()
  assert meta["model"]["param_dtype"] == "bfloat16"
  import orbax.checkpoint as ocp  # pylint: disable=import-outside-toplevel

  raw = ocp.StandardCheckpointer().restore(
      os.path.join(ck.directory, str(ck.latest_step()), "state")
  )
  dtypes = lambda t: {str(np.asarray(x).dtype) for x in jax.tree.leaves(t)}
  assert dtypes(raw["params"]) == {"bfloat16"}
  assert dtypes(raw["opt_state"]) <= {"float32", "int32"}
  ck.close()
