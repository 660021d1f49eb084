"""Ghost-norm per-rollout statistics (``ghost.py``) against an independent
Python loop of ``jax.grad`` over rollouts, and against the vmap path
(``gradstats.group_moments``), per parameter leaf: several batches, every
aggregation mode, both exact forms (Gram sums and formed group gradients),
and the model options (GQA, q/k/v biases, q/k norms, tied embeddings, a PPO
value head)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from cbs_jax import config as config_lib
from cbs_jax import ghost
from cbs_jax import gradstats
from cbs_jax import model as model_lib
from cbs_jax import objective
from cbs_jax import rl
from cbs_jax import scoring

P, K, TP, TC, V = 3, 4, 4, 5, 12
MODES = ("token_mean", "seq_mean_token_mean", "seq_mean_token_sum_norm")


def tiny(seed=0, **over):
  c = model_lib.default_config()
  c.update(vocab_size=V, d_model=16, num_layers=2, num_heads=4, num_kv_heads=2, d_ff=24, max_len=16)
  c.update(**over)
  return model_lib.build(c, seed)


_score = jax.jit(scoring.score, static_argnums=(0, 6))


def make_batch(graphdef, params, seed=0, on_policy=False):
  rng = np.random.default_rng(seed)
  B = P * K
  plen = rng.integers(1, TP + 1, size=B)
  prompt_mask = np.arange(TP)[None] >= (TP - plen)[:, None]
  prompt = np.where(prompt_mask, rng.integers(3, V, size=(B, TP)), 0)
  clen = rng.integers(1, TC + 1, size=B)
  cmask = (np.arange(TC)[None] < clen[:, None]).astype(np.float32)
  completion = np.where(cmask > 0, rng.integers(3, V, size=(B, TC)), 0)
  sc = _score(
      graphdef,
      params,
      jnp.asarray(prompt),
      jnp.asarray(prompt_mask),
      jnp.asarray(completion),
      jnp.asarray(cmask),
      scoring.SamplingSpec(),
  )
  logp_old = (sc.logprobs + rng.uniform(-0.3, 0.3, size=(B, TC))) * cmask  # some clipped
  adv = np.repeat(rng.normal(size=B), TC).reshape(B, TC) * cmask
  logp_ref = (sc.logprobs + rng.uniform(-0.3, 0.3, size=(B, TC))) * cmask
  values = rng.normal(size=(B, TC)) * cmask
  return dict(
      prompt=jnp.asarray(prompt, jnp.int32),
      prompt_mask=jnp.asarray(prompt_mask),
      completion=jnp.asarray(completion, jnp.int32),
      completion_mask=jnp.asarray(cmask),
      logp_old=jnp.asarray(logp_old, jnp.float32),
      adv=jnp.asarray(adv, jnp.float32),
      logp_ref=jnp.asarray(logp_ref, jnp.float32),
      returns=jnp.asarray(values + rng.normal(size=(B, TC)) * cmask, jnp.float32),
      old_values=jnp.asarray(values, jnp.float32),
      on_policy=jnp.full((B,), on_policy),
  )


def cfgs(mode="token_mean", kl_beta=0.1, loss="ppo", algo="grpo"):
  c = config_lib.base_config()
  c.rl.aggregation, c.rl.kl_beta, c.rl.loss, c.rl.algo = mode, kl_beta, loss, algo
  return rl.RLSpec.from_config(c.rl), scoring.SamplingSpec.from_config(c.sampling)


def fns(graphdef, rl_cfg, s_cfg, form="auto"):
  """Jitted (params, batch) functions, compiled once per test for every batch:
  ghost moments + grad + loss, vmap moments, one rollout's gradient, the
  batch loss and gradient."""
  ghost_fn = jax.jit(
      lambda p, b: ghost.moments_and_grad(p, graphdef, b, P, K, rl_cfg, s_cfg, form=form)
  )
  vmap_fn = jax.jit(lambda p, b: gradstats.group_moments(p, graphdef, b, P, K, rl_cfg, s_cfg, 1))

  @jax.jit
  def grad_i(i, p, b):  # i traced: one compile for every rollout
    counts = objective.counts_of(b)
    return jax.grad(
        lambda q: objective.rollout_losses(q, graphdef, b, counts, rl_cfg, s_cfg)[0][i]
    )(p)

  plain = jax.jit(
      lambda p, b: jax.value_and_grad(objective.batch_loss, has_aux=True)(
          p, graphdef, b, objective.counts_of(b), rl_cfg, s_cfg
      )
  )
  return ghost_fn, vmap_fn, grad_i, plain


def loop_moments(grad_i, params, batch):
  """Per-leaf moments from g_i = N grad L_i, one jax.grad per rollout."""
  N = P * K
  g = [
      [N * np.ravel(np.asarray(x, np.float64)) for x in jax.tree.leaves(grad_i(i, params, batch))]
      for i in range(N)
  ]
  L = len(g[0])
  sq = np.zeros((L, P))
  msq = np.zeros((L, P))
  bsq = np.zeros(L)
  for l in range(L):
    gl = np.stack([g[i][l] for i in range(N)]).reshape(P, K, -1)
    sq[l] = np.sum(gl * gl, axis=(1, 2))
    msq[l] = np.sum(gl.mean(1) ** 2, axis=-1)
    bsq[l] = np.sum(gl.mean((0, 1)) ** 2)
  return sq, msq, bsq


def check(m, ref, rtol=2e-4):
  sq, msq, bsq = ref
  scale = lambda a: rtol * np.max(np.abs(a))  # leaves whose terms are ~0 compare absolutely
  np.testing.assert_allclose(np.asarray(m.sum_sqnorm_P), sq, rtol=rtol, atol=scale(sq))
  np.testing.assert_allclose(np.asarray(m.mean_sqnorm_P), msq, rtol=rtol, atol=scale(msq))
  np.testing.assert_allclose(np.asarray(m.batch_mean_sqnorm), bsq, rtol=rtol, atol=scale(bsq))


@pytest.mark.parametrize("mode", MODES)
def test_matches_loop_and_vmap_every_aggregation_several_batches(mode):
  graphdef, params = tiny()
  rl_cfg, s_cfg = cfgs(mode)
  ghost_fn, vmap_fn, grad_i, plain = fns(graphdef, rl_cfg, s_cfg)
  for seed in (0, 1, 2):
    batch = make_batch(graphdef, params, seed=seed, on_policy=seed == 1)
    ref = loop_moments(grad_i, params, batch)
    assert np.all(ref[0].sum(0) > 0) and ref[2].sum() > 0  # not vacuous
    m, grad, loss = ghost_fn(params, batch)
    check(m, ref)
    v = vmap_fn(params, batch)
    check(
        m,
        (np.asarray(v.sum_sqnorm_P), np.asarray(v.mean_sqnorm_P), np.asarray(v.batch_mean_sqnorm)),
    )
    (want_loss, _), want = plain(params, batch)
    assert float(loss) == pytest.approx(float(want_loss), rel=1e-5, abs=1e-7)
    for a, b in zip(jax.tree.leaves(grad), jax.tree.leaves(want)):
      np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6)


@pytest.mark.parametrize("form", ["gram", "materialize"])
def test_both_exact_forms(form):
  graphdef, params = tiny(seed=1)
  rl_cfg, s_cfg = cfgs("seq_mean_token_mean", kl_beta=0.0, loss="cispo")
  ghost_fn, _, grad_i, plain = fns(graphdef, rl_cfg, s_cfg, form)
  batch = make_batch(graphdef, params, seed=3)
  m, grad, _ = ghost_fn(params, batch)
  check(m, loop_moments(grad_i, params, batch))
  # the batch gradient: one contraction (gram) or the sum of the formed
  # per-rollout gradients (materialize), against autodiff's
  (_, _), want = plain(params, batch)
  for a, b in zip(jax.tree.leaves(grad), jax.tree.leaves(want)):
    np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6)


def test_model_options_tied_biases_qk_norm_value_head():
  """Tied embeddings (two uses of one table: Gram cross terms), q/k/v biases,
  q/k RMSNorm, head_dim != d_model / heads and PPO's value loss."""
  graphdef, params = tiny(
      seed=2, tie_embeddings=True, qkv_bias=True, qk_norm=True, head_dim=6, value_head=True
  )
  params = jax.tree.map(
      lambda x: x + 0.1 * jax.random.normal(jax.random.key(7), x.shape), params
  )  # non-zero biases, non-unit norm scales
  rl_cfg, s_cfg = cfgs("token_mean", kl_beta=0.05, algo="ppo")
  batch = make_batch(graphdef, params, seed=4)
  _, _, grad_i, _ = fns(graphdef, rl_cfg, s_cfg)
  ref = loop_moments(grad_i, params, batch)
  for form in ("gram", "materialize"):
    check(fns(graphdef, rl_cfg, s_cfg, form)[0](params, batch)[0], ref)


def test_bad_shapes_and_form_raise():
  graphdef, params = tiny()
  rl_cfg, s_cfg = cfgs()
  batch = make_batch(graphdef, params)
  with pytest.raises(ValueError, match="P \\* K"):
    ghost.group_moments(params, graphdef, batch, P + 1, K, rl_cfg, s_cfg)
  with pytest.raises(ValueError, match="K must be a positive integer"):
    ghost.group_moments(params, graphdef, batch, P, 0, rl_cfg, s_cfg)
  with pytest.raises(ValueError, match="form"):
    ghost.moments_and_grad(params, graphdef, batch, P, K, rl_cfg, s_cfg, form="fast")


def test_default_forward_has_no_taps():
  """The taps cost nothing unless asked for: the default forward's jaxpr is
  the same whether or not ghost.py was used before."""
  graphdef, params = tiny()
  batch = make_batch(graphdef, params)
  args = scoring.teacher_forcing_inputs(
      batch["prompt"], batch["prompt_mask"], batch["completion"], batch["completion_mask"]
  )
  before = str(jax.make_jaxpr(lambda p: model_lib.apply(graphdef, p, *args).logits)(params))
  rl_cfg, s_cfg = cfgs()
  jax.eval_shape(
      lambda p, b: ghost.group_moments(p, graphdef, b, P, K, rl_cfg, s_cfg), params, batch
  )  # traces the tapped forward
  after = str(jax.make_jaxpr(lambda p: model_lib.apply(graphdef, p, *args).logits)(params))
  assert before == after


def test_gradstats_dispatches_to_ghost():
  """``gradstats.group_moments(method="ghost")`` (what the trainer calls under
  ``noise.exact_method="ghost"``) equals the vmap path; the metric and
  per-group forms refuse it by name."""
  graphdef, params = tiny(seed=2)
  rl_cfg, s_cfg = cfgs("token_mean")
  batch = make_batch(graphdef, params, seed=4)
  args = (params, graphdef, batch, P, K, rl_cfg, s_cfg, 1)
  # each path as one program (op by op, every primitive is its own compile)
  moments = jax.jit(
      gradstats.group_moments, static_argnums=(1, 3, 4, 5, 6, 7), static_argnames="method"
  )
  v = moments(*args)
  g = moments(*args, method="ghost")
  check(
      g, (np.asarray(v.sum_sqnorm_P), np.asarray(v.mean_sqnorm_P), np.asarray(v.batch_mean_sqnorm))
  )
  with pytest.raises(ValueError, match="method='vmap'"):
    gradstats.group_moments(*args, prompt_groups=np.zeros(P, int), num_groups=1, method="ghost")
  with pytest.raises(ValueError, match="nosuch"):
    gradstats.group_moments(*args, method="nosuch")
