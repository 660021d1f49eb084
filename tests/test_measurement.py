"""The noise estimators on real GRPO batches of a real (tiny) policy.

Independent check: at fixed parameters, the empirical covariance trace of
many independent batch gradients must equal (trI + K trB) / N from the
per-batch estimators -- with the measurement normaliser (a token sum over
N * Tc, no dependence on the other rollouts' lengths).
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from cbs_jax import config as config_lib
from cbs_jax import gradstats
from cbs_jax import noise
from cbs_jax import objective
from cbs_jax import run_setup
from cbs_jax import train


@pytest.fixture(scope="module")
def policy(tmp_path_factory):
  c = config_lib.base_config()
  c.task.kwargs.min_digits, c.task.kwargs.max_digits = 1, 1
  c.model.d_model, c.model.d_ff, c.model.num_layers = 32, 64, 1
  c.sft.steps, c.sft.batch_size, c.sft.eval_every, c.sft.lr = 120, 64, 0, 1e-2
  c.sft.label_noise = 0.4  # mixed rewards within groups: non-zero advantages
  c.train.eval_prompts, c.train.progress = 32, False
  c.rl.aggregation = "seq_mean_token_sum_norm"  # the measurement normaliser
  c.batch.num_prompts, c.batch.rollouts_per_prompt = 4, 4
  setup = run_setup.prepare(c)
  graphdef, params, _ = train.sft_base(c, str(tmp_path_factory.mktemp("sft")), setup)
  return c, setup, graphdef, params


def test_batch_gradient_covariance_matches_estimators(policy):
  c, setup, graphdef, params = policy
  P, K = c.batch.num_prompts, c.batch.rollouts_per_prompt
  N = P * K
  M = 300

  @jax.jit
  def grad_and_moments(params, b):
    counts = objective.counts_of(b)
    g = jax.grad(
        lambda p: objective.batch_loss(p, graphdef, b, counts, setup.rl, setup.sampling)[0]
    )(params)
    flat = jnp.concatenate([x.reshape(-1) for x in jax.tree.leaves(g)])
    mom = gradstats.group_moments(params, graphdef, b, P, K, setup.rl, setup.sampling, 1)
    return flat, noise.exact_estimates(gradstats.sum_leaves(mom))

  grads, pred = [], []
  for m in range(M):
    b, _, _ = train.round_batch(c, graphdef, params, params, setup, 10_000 + m)
    b["on_policy"] = jnp.ones((N,), bool)
    g, est = grad_and_moments(params, b)
    grads.append(np.asarray(g, np.float64))
    pred.append(float(est["trace_intra"] + K * est["trace_inter"]) / N)
  grads, pred = np.stack(grads), np.asarray(pred)
  assert np.mean(np.abs(grads).sum(1) > 0) > 0.5  # most batches carry signal

  # empirical tr Cov(batch gradient) and its bootstrap SE over batches
  emp = grads.var(axis=0, ddof=1).sum()
  rng = np.random.default_rng(0)
  boots = [
      grads[i].var(axis=0, ddof=1).sum() for i in (rng.integers(M, size=M) for _ in range(200))
  ]
  se_emp = np.std(boots)
  se_pred = pred.std(ddof=1) / np.sqrt(M)
  z = (pred.mean() - emp) / np.hypot(se_emp, se_pred)
  assert abs(z) < 4, (pred.mean(), emp, se_emp, se_pred)
  assert abs(pred.mean() / emp - 1) < 0.35
