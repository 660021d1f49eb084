"""The RL objective on a tiny transformer: finite differences, microbatch
invariance, and the per-rollout / split gradient statistics against a plain
Python loop of jax.grad."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from cbs_jax import config as config_lib
from cbs_jax import gradstats
from cbs_jax import model as model_lib
from cbs_jax import noise
from cbs_jax import noise_tracker
from cbs_jax import objective
from cbs_jax import rl
from cbs_jax import scoring
from tests.noise_model import naive_split

P, K, TP, TC, V = 4, 4, 4, 5, 12
MODES = ("token_mean", "seq_mean_token_mean", "seq_mean_token_sum_norm")


def tiny_model(seed=0):
  c = model_lib.default_config()
  c.vocab_size, c.d_model, c.num_layers, c.num_heads = V, 16, 1, 2
  c.num_kv_heads, c.d_ff, c.max_len = 1, 32, 16
  return model_lib.build(c, seed)


def make_batch(graphdef, params, seed=0):
  rng = np.random.default_rng(seed)
  B = P * K
  plen = rng.integers(1, TP + 1, size=B)
  prompt_mask = np.arange(TP)[None] >= (TP - plen)[:, None]
  prompt = np.where(prompt_mask, rng.integers(3, V, size=(B, TP)), 0)
  clen = rng.integers(1, TC + 1, size=B)
  cmask = (np.arange(TC)[None] < clen[:, None]).astype(np.float32)
  completion = np.where(cmask > 0, rng.integers(3, V, size=(B, TC)), 0)
  sc = scoring.score(
      graphdef,
      params,
      jnp.asarray(prompt),
      jnp.asarray(prompt_mask),
      jnp.asarray(completion),
      jnp.asarray(cmask),
      scoring.SamplingSpec(),
  )
  # behaviour log-probs near the current ones: ratios in (0.95, 1.05), no clipping
  logp_old = (sc.logprobs + rng.uniform(-0.05, 0.05, size=(B, TC))) * cmask
  adv = np.repeat(rng.normal(size=B), TC).reshape(B, TC) * cmask
  logp_ref = (sc.logprobs + rng.uniform(-0.3, 0.3, size=(B, TC))) * cmask
  return dict(
      prompt=jnp.asarray(prompt, jnp.int32),
      prompt_mask=jnp.asarray(prompt_mask),
      completion=jnp.asarray(completion, jnp.int32),
      completion_mask=jnp.asarray(cmask),
      logp_old=jnp.asarray(logp_old, jnp.float32),
      adv=jnp.asarray(adv, jnp.float32),
      logp_ref=jnp.asarray(logp_ref, jnp.float32),
      returns=jnp.zeros((B, TC)),
      old_values=jnp.zeros((B, TC)),
      on_policy=jnp.zeros((B,), bool),
  )


def cfgs(mode="token_mean", kl_beta=0.1, loss="ppo"):
  c = config_lib.base_config()
  c.rl.aggregation, c.rl.kl_beta, c.rl.loss = mode, kl_beta, loss
  return rl.RLSpec.from_config(c.rl), scoring.SamplingSpec.from_config(c.sampling)


def test_grpo_loss_gradient_matches_central_finite_differences():
  graphdef, params = tiny_model()
  batch = make_batch(graphdef, params)
  rl_cfg, s_cfg = cfgs("seq_mean_token_mean", kl_beta=0.1)
  counts = objective.counts_of(batch)
  f = jax.jit(lambda p: objective.batch_loss(p, graphdef, batch, counts, rl_cfg, s_cfg)[0])
  grad = jax.grad(f)(params)
  rng = np.random.default_rng(1)
  for trial in range(3):
    v = jax.tree.map(lambda x: rng.normal(size=x.shape), params)
    norm = np.sqrt(sum(np.sum(x * x) for x in jax.tree.leaves(v)))
    v = jax.tree.map(lambda x: jnp.asarray(x / norm, jnp.float32), v)  # unit direction
    eps = 1e-2
    plus = jax.tree.map(lambda x, d: x + eps * d, params, v)
    minus = jax.tree.map(lambda x, d: x - eps * d, params, v)
    fd = (float(f(plus)) - float(f(minus))) / (2 * eps)
    an = sum(float(jnp.vdot(g, d)) for g, d in zip(jax.tree.leaves(grad), jax.tree.leaves(v)))
    assert fd == pytest.approx(an, rel=1e-2, abs=2e-5), (trial, fd, an)


@pytest.mark.slow  # three aggregations, three batch shapes each
@pytest.mark.parametrize("mode", MODES)
def test_loss_and_gradient_identical_under_microbatching(mode):
  graphdef, params = tiny_model()
  batch = make_batch(graphdef, params)
  rl_cfg, s_cfg = cfgs(mode)
  counts = objective.counts_of(batch)
  vg = jax.jit(jax.value_and_grad(objective.batch_loss, has_aux=True), static_argnums=(1, 4, 5))
  (loss, _), grad = vg(params, graphdef, batch, counts, rl_cfg, s_cfg)
  for n_micro in (2, 4):
    size = P * K // n_micro
    tot_loss, tot_grad = 0.0, jax.tree.map(jnp.zeros_like, grad)
    for i in range(n_micro):
      mb = {k: v[i * size : (i + 1) * size] for k, v in batch.items()}
      (l, _), g = vg(params, graphdef, mb, counts, rl_cfg, s_cfg)
      tot_loss += l
      tot_grad = jax.tree.map(jnp.add, tot_grad, g)
    assert float(tot_loss) == pytest.approx(float(loss), abs=1e-6)
    for a, b in zip(jax.tree.leaves(tot_grad), jax.tree.leaves(grad)):
      np.testing.assert_allclose(a, b, atol=1e-6)


def naive_per_rollout_grads(graphdef, params, batch, rl_cfg, s_cfg):
  """g_i = N * grad L_i by a Python loop over rollouts: [P, K, D] numpy."""
  counts = objective.counts_of(batch)
  N = P * K
  # rollout i's loss, i a traced index: one compile serves every rollout
  loss_i = lambda p, i: objective.rollout_losses(p, graphdef, batch, counts, rl_cfg, s_cfg)[0][i]
  grad_i = jax.jit(jax.grad(loss_i))
  out = []
  for i in range(N):
    g = grad_i(params, i)
    out.append(np.concatenate([N * np.ravel(x) for x in jax.tree.leaves(g)]))
  return np.stack(out).reshape(P, K, -1)


@pytest.mark.slow  # per-rollout loops x 3 aggregations
@pytest.mark.parametrize("mode", MODES)
def test_per_rollout_and_split_statistics_match_a_python_loop(mode):
  graphdef, params = tiny_model()
  batch = make_batch(graphdef, params, seed=2)
  rl_cfg, s_cfg = cfgs(mode)
  g = naive_per_rollout_grads(graphdef, params, batch, rl_cfg, s_cfg)
  counts = objective.counts_of(batch)
  # each path compiled as one program (op by op, every primitive is its own
  # compile: most of the test's time)
  vg = jax.jit(jax.value_and_grad(objective.batch_loss, has_aux=True), static_argnums=(1, 4, 5))
  moments = jax.jit(gradstats.group_moments, static_argnums=(1, 3, 4, 5, 6, 7))
  (_, _), grad = vg(params, graphdef, batch, counts, rl_cfg, s_cfg)
  flat_grad = np.concatenate([np.ravel(x) for x in jax.tree.leaves(grad)])
  # mean of g_i is exactly the batch gradient
  np.testing.assert_allclose(g.mean(axis=(0, 1)), flat_grad, atol=2e-6)
  ref = noise.moments_from_grads(jnp.asarray(g, jnp.float32))
  # chunked (1 prompt per chunk) and unchunked (all prompts) streaming paths
  for chunk in (1, 2, P):
    m = gradstats.sum_leaves(moments(params, graphdef, batch, P, K, rl_cfg, s_cfg, chunk))
    np.testing.assert_allclose(m.sum_sqnorm_P, ref.sum_sqnorm_P, rtol=1e-4)
    np.testing.assert_allclose(m.mean_sqnorm_P, ref.mean_sqnorm_P, rtol=1e-4)
    np.testing.assert_allclose(m.batch_mean_sqnorm, ref.batch_mean_sqnorm, rtol=1e-4)
  # split path: its gradient is the batch gradient, its moments those of the
  # four quarter means of the naive per-rollout gradients
  split = jax.jit(gradstats.split_grads, static_argnums=(1, 3, 4, 5, 6))
  _, sgrad, _, smom = split(params, graphdef, batch, P, K, rl_cfg, s_cfg)
  np.testing.assert_allclose(
      np.concatenate([np.ravel(x) for x in jax.tree.leaves(sgrad)]), flat_grad, atol=2e-6
  )
  q = np.stack(
      [
          np.stack(
              [
                  g[a * P // 2 : (a + 1) * P // 2, b * K // 2 : (b + 1) * K // 2].mean(axis=(0, 1))
                  for b in range(2)
              ]
          )
          for a in range(2)
      ]
  )
  want = noise.split_moments_from_quarters(jnp.asarray(q), P, K)
  got = gradstats.sum_leaves(smom)
  for f in ("d_intra", "d_inter", "cross"):
    np.testing.assert_allclose(getattr(got, f), getattr(want, f), rtol=1e-4, atol=1e-7)


def test_split_grid_cells_hold_the_right_rollouts():
  """``split_grads`` on non-square grids against the pairwise moments, by
  loops, of the cell means of the per-rollout gradients from a Python loop:
  a cell built from the wrong rollouts, or cells stacked in the wrong order,
  moves d_intra and d_inter. Both forms of ``cell_grads``: separate cell
  gradients (the CPU's for large cells) and one gradient vmapped over the
  cells (every other platform's, and the CPU's for small cells: what "auto"
  takes here, ``test_cell_form_takes_separate_cells_only_where_they_are_large``)."""
  graphdef, params = tiny_model()
  batch = make_batch(graphdef, params, seed=3)
  rl_cfg, s_cfg = cfgs()
  g = naive_per_rollout_grads(graphdef, params, batch, rl_cfg, s_cfg)  # [P, K, D]
  for cells in ("separate", "vmapped"):
    for m, n in ((4, 2), (2, 4)):
      q = g.reshape(m, P // m, n, K // n, -1).mean(axis=(1, 3))
      want = naive_split(q, P, K)
      _, grad, _, mom = gradstats.split_grads(
          params, graphdef, batch, P, K, rl_cfg, s_cfg, m=m, n=n, cells=cells
      )
      got = gradstats.sum_leaves(mom)
      assert (got.prompt_parts, got.rollout_parts) == (m, n), cells
      for f in ("d_intra", "d_inter", "cross"):
        np.testing.assert_allclose(
            float(getattr(got, f)), want[f], rtol=1e-4, atol=1e-7, err_msg=f"{cells} {m}x{n} {f}"
        )
      flat = np.concatenate([np.ravel(x) for x in jax.tree.leaves(grad)])
      np.testing.assert_allclose(flat, g.mean(axis=(0, 1)), atol=2e-6, err_msg=cells)


def test_cell_form_takes_separate_cells_only_where_they_are_large(monkeypatch):
  """ "auto" takes the platform split (separate cells on the CPU) from
  ``SEPARATE_MIN_ROWS`` token rows per cell in a one-device process, and the
  vmapped cells below or where the batch may be sharded over devices; a
  forced form is kept at every size; an unknown form is an error naming it.
  And ``cell_grads`` follows it."""
  lim = gradstats.SEPARATE_MIN_ROWS
  assert gradstats.cell_form("auto", lim - 1) == "vmapped"
  assert gradstats.cell_form("auto", lim) == "platform"
  assert gradstats.cell_form("auto", 10 * lim, devices=8) == "vmapped"  # a sharded batch
  for forced in ("separate", "vmapped"):
    assert gradstats.cell_form(forced, 1) == gradstats.cell_form(forced, 10 * lim) == forced
  with pytest.raises(ValueError, match="cells='vmap'"):
    gradstats.cell_form("vmap", lim)
  graphdef, params = tiny_model()
  batch = make_batch(graphdef, params)
  rl_cfg, s_cfg = cfgs()
  rows = gradstats.cell_rows(batch, P, K)
  # P K / 4 rollouts of prompt + completion tokens: small cells
  assert rows == (P * K) // 4 * (batch["prompt"].shape[1] + batch["completion"].shape[1]) < lim

  def forms_traced(min_rows):
    """The cell forms ``cell_grads`` traces under "auto" at this threshold."""
    seen = []
    for name in ("_cells_separate", "_cells_vmapped"):
      form = getattr(gradstats, name)
      monkeypatch.setattr(
          gradstats, name, lambda *a, form=form, name=name: seen.append(name) or form(*a)
      )
    monkeypatch.setattr(gradstats, "SEPARATE_MIN_ROWS", min_rows)
    jax.make_jaxpr(lambda p: gradstats.cell_grads(p, graphdef, batch, P, K, rl_cfg, s_cfg)[1])(
        params
    )
    monkeypatch.undo()
    return sorted(seen)

  assert forms_traced(lim) == ["_cells_vmapped"]
  # the platform split traces both branches: the CPU's and every other platform's
  assert forms_traced(rows) == ["_cells_separate", "_cells_vmapped"]


def test_chunk_size_not_dividing_prompts_is_an_error():
  graphdef, params = tiny_model()
  batch = make_batch(graphdef, params)
  rl_cfg, s_cfg = cfgs()
  with pytest.raises(ValueError, match="chunk_prompts=3"):
    gradstats.group_moments(params, graphdef, batch, P, K, rl_cfg, s_cfg, chunk_prompts=3)


def test_param_groups_cover_every_leaf():
  _, params = tiny_model()
  groups = [gradstats.param_group(p) for p in gradstats.leaf_paths(params)]
  assert set(groups) == set(gradstats.PARAM_GROUPS)


def _naive_breakdown(g, groups):
  """Per-group contributions to tr Sigma_inter computed directly from the
  per-rollout gradients g [P, K, D] (independent of noise.inter_by_group)."""
  Pn, Kn = g.shape[:2]
  gbar_p = g.mean(axis=1)
  gbar = gbar_p.mean(axis=0)
  s2 = ((g - gbar_p[:, None]) ** 2).sum(axis=(1, 2)) / (Kn - 1)
  out = []
  for d in sorted(set(groups)):
    sel = np.asarray(groups) == d
    scatter = ((gbar_p[sel] - gbar) ** 2).sum()
    out.append(scatter / (Pn - 1) - s2[sel].sum() / (Pn * Kn))
  return np.array(out)


def test_inter_prompt_breakdown_sums_to_the_pooled_term_synthetic():
  rng = np.random.default_rng(3)
  Pn, Kn, D = 12, 6, 7
  groups = rng.integers(0, 3, size=Pn)
  groups[:3] = [0, 1, 2]  # every group present
  offset = np.array([0.0, 2.0, -1.0])[groups]  # groups differ in mean
  g = rng.normal(size=(Pn, Kn, D)) + rng.normal(size=(Pn, 1, D)) + offset[:, None, None]
  m = noise.moments_from_grads(jnp.asarray(g, jnp.float32))
  S = np.stack([g.mean(axis=1)[groups == d].sum(axis=0) for d in range(3)])
  out = noise.inter_by_group(m, groups, jnp.asarray(S @ S.T, jnp.float32))
  total = noise.exact_estimates(m)["trace_inter"]
  np.testing.assert_allclose(np.sum(out["contribution"]), total, rtol=1e-5)
  np.testing.assert_allclose(out["contribution"], _naive_breakdown(g, groups), rtol=1e-4, atol=1e-5)
  np.testing.assert_allclose(out["count"], np.bincount(groups, minlength=3))
  np.testing.assert_allclose(np.sum(out["share"]), 1.0, rtol=1e-5)


def test_grouped_moments_on_the_model_match_a_python_loop():
  graphdef, params = tiny_model()
  batch = make_batch(graphdef, params, seed=4)
  rl_cfg, s_cfg = cfgs("seq_mean_token_sum_norm")
  g = naive_per_rollout_grads(graphdef, params, batch, rl_cfg, s_cfg)
  groups = np.array([0, 1, 1, 0])
  mom, gram = gradstats.group_moments(
      params,
      graphdef,
      batch,
      P,
      K,
      rl_cfg,
      s_cfg,
      chunk_prompts=2,
      prompt_groups=groups,
      num_groups=2,
  )
  m = gradstats.sum_leaves(mom)
  ref = noise.moments_from_grads(jnp.asarray(g, jnp.float32))
  np.testing.assert_allclose(m.sum_sqnorm_P, ref.sum_sqnorm_P, rtol=1e-4)
  out = noise.inter_by_group(m, groups, jnp.sum(gram, axis=0))
  np.testing.assert_allclose(out["contribution"], _naive_breakdown(g, groups), rtol=1e-3, atol=1e-6)


def test_noise_in_adams_metric_matches_scaled_per_rollout_gradients():
  """Exact moments with a metric D equal those of D * g_i from the loop."""
  graphdef, params = tiny_model()
  batch = make_batch(graphdef, params, seed=5)
  rl_cfg, s_cfg = cfgs("seq_mean_token_mean")
  rng = np.random.default_rng(6)
  metric = jax.tree.map(lambda x: jnp.asarray(rng.uniform(0.5, 3.0, x.shape), jnp.float32), params)
  g = naive_per_rollout_grads(graphdef, params, batch, rl_cfg, s_cfg)
  d = np.concatenate([np.ravel(x) for x in jax.tree.leaves(metric)])
  ref = noise.moments_from_grads(jnp.asarray(g * d, jnp.float32))
  m = gradstats.sum_leaves(
      gradstats.group_moments(
          params, graphdef, batch, P, K, rl_cfg, s_cfg, chunk_prompts=2, metric=metric
      )
  )
  np.testing.assert_allclose(m.sum_sqnorm_P, ref.sum_sqnorm_P, rtol=1e-4)
  np.testing.assert_allclose(m.batch_mean_sqnorm, ref.batch_mean_sqnorm, rtol=1e-4)
  # the split path in the same metric: moments of the scaled quarter means
  _, _, _, (raw, scaled) = gradstats.split_grads(
      params, graphdef, batch, P, K, rl_cfg, s_cfg, metric=metric
  )
  gd = g * d
  q = np.stack(
      [
          np.stack(
              [
                  gd[a * P // 2 : (a + 1) * P // 2, b * K // 2 : (b + 1) * K // 2].mean(axis=(0, 1))
                  for b in range(2)
              ]
          )
          for a in range(2)
      ]
  )
  want = noise.split_moments_from_quarters(jnp.asarray(q), P, K)
  got = gradstats.sum_leaves(scaled)
  for f in ("d_intra", "d_inter", "cross"):
    np.testing.assert_allclose(getattr(got, f), getattr(want, f), rtol=1e-4, atol=1e-7)


def _adam_state_like(params, count, nu):
  """optax.adam's state for ``params`` with step ``count`` and second moment ``nu``."""
  state = optax.adam(1e-3).init(params)
  return jax.tree.map(
      lambda s: (
          s._replace(count=jnp.asarray(count, jnp.int32), nu=nu)
          if isinstance(s, optax.ScaleByAdamState)
          else s
      ),
      state,
      is_leaf=lambda s: isinstance(s, optax.ScaleByAdamState),
  )


@pytest.mark.parametrize("steps_before", [0, 1, 30])
def test_adam_metric_with_the_gradient_is_the_preconditioner_of_adams_step(steps_before):
  """With b1 = 0 Adam's step is -lr * g * D: optax's own update is the
  independent computation, from the first step on (where the metric taken
  before the update is undefined)."""
  rng = np.random.default_rng(steps_before)
  params = {"w": jnp.zeros((5, 3)), "b": jnp.zeros((3,))}
  draw = lambda: jax.tree.map(lambda x: jnp.asarray(rng.normal(size=x.shape), jnp.float32), params)
  tx = optax.adam(0.1, b1=0.0, b2=0.99, eps=1e-8)
  state = tx.init(params)
  for _ in range(steps_before):
    _, state = tx.update(draw(), state, params)
  g = draw()
  d = gradstats.adam_metric(state, 0.99, 1e-8, g)
  upd, _ = tx.update(g, state, params)
  for leaf_u, leaf_g, leaf_d in zip(*(jax.tree.leaves(t) for t in (upd, g, d))):
    np.testing.assert_allclose(leaf_u, -0.1 * leaf_g * leaf_d, rtol=1e-5)
  before = gradstats.adam_metric(state, 0.99, 1e-8)  # the old definition, for contrast
  if steps_before == 0:  # nu = 0: the old metric is 1 / eps, ~10^8 x too large
    assert float(jax.tree.leaves(before)[0].min()) > 1e7


def test_adam_metric_tracker_equals_the_raw_one_where_the_preconditioner_is_the_identity():
  """nu chosen so that Adam's nu_hat after this gradient is exactly 1 (eps 0):
  the split moments in Adam's metric equal the raw ones, and so do the two
  trackers fed with them."""
  graphdef, params = tiny_model()
  rl_cfg, s_cfg = cfgs("seq_mean_token_mean")
  b2, count = 0.99, 50
  raw_ema, adam_ema = noise_tracker.NoiseEMA(0.8), noise_tracker.NoiseEMA(0.8)
  for seed in range(4):
    batch = make_batch(graphdef, params, seed=seed)
    _, g, _, _ = gradstats.split_grads(params, graphdef, batch, P, K, rl_cfg, s_cfg)
    corr = 1.0 - b2 ** (count + 1)
    nu = jax.tree.map(lambda x: (corr - (1.0 - b2) * x * x) / b2, g)
    assert min(float(jnp.min(v)) for v in jax.tree.leaves(nu)) >= 0.0
    opt_state = _adam_state_like(params, count, nu)
    metric = lambda grad: gradstats.adam_metric(opt_state, b2, 0.0, grad)
    _, _, _, (raw, scaled) = gradstats.split_grads(
        params, graphdef, batch, P, K, rl_cfg, s_cfg, metric=metric
    )
    e_raw = noise.split_estimates(gradstats.sum_leaves(raw))
    e_adam = noise.split_estimates(gradstats.sum_leaves(scaled))
    for k in noise.ESTIMATE_KEYS:
      np.testing.assert_allclose(float(e_adam[k]), float(e_raw[k]), rtol=1e-4, atol=1e-9)
    raw_ema.update(e_raw, P, K)
    adam_ema.update(e_adam, P, K)
  for k, v in raw_ema.value().items():
    assert adam_ema.value()[k] == pytest.approx(v, rel=1e-4, abs=1e-9)
