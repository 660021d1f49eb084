"""Exact per-rollout gradient statistics from ONE forward + backward (ghost norms).

``group_moments`` returns the same ``noise.GroupMoments`` as
``gradstats.group_moments`` (per leaf, per prompt: sum_k |g_{p,k}|^2,
|gbar_p|^2, and |gbar|^2, with g_i = N grad L_i) without forming the
per-rollout gradients that ``jax.vmap(jax.grad)`` materialises.

How. The model taps every parameter use (``model.Tapped``): under
``nnx.capture`` with ``capture_taps`` set, a use y = f(x; W) records its input
x and adds a zero ``nnx.Perturbation`` to its output y. One backward pass of
the batch loss L = sum_i L_i with respect to the perturbations gives dL/dy at
every token of every rollout; rollout i's activations enter L_i only (the
counts of the aggregation are inputs), so the rows of dL/dy that belong to
rollout i are dL_i/dy. Then, per parameter use:

* dense, y_t = x_t W (q/k/v/o projections, SwiGLU, LM head, value head):
  grad_W L_i = sum_{t in i} x_t^T dy_t, and its squared norm by the Gram
  identity  |grad_W L_i|_F^2 = sum_{t,s in i} (x_t . x_s)(dy_t . dy_s)
  (T^2 (din + dout) work per rollout instead of a din x dout gradient);
* embedding gather, x_t = E[tok_t]: x_t . x_s above becomes [tok_t == tok_s];
  with tied embeddings the table's two uses (gather and head) add, and the
  cross terms of |a + b|^2 are Gram sums of the same kind;
* RMSNorm scales and q/k/v biases: the per-rollout gradient itself
  (d_model-sized) is formed and squared.

Per-prompt norms |gbar_p|^2 are the same computation with a prompt's K
rollouts' tokens as one group (K T rows), and the batch gradient is the plain
weight-gradient contraction over all rows (returned by ``moments_and_grad``).
For every group and parameter the cheaper of the two exact forms is used:
the Gram sum, or forming the group's gradient (when din x dout <= rows x
(din + dout), e.g. small matrices or short sequences). Where a level's
group gradients are formed, the coarser levels' are their sums (per
rollout -> per prompt -> batch), so no second contraction over the tokens
is spent on them.

Scope: the cbs_jax decoder (``model.Transformer``, every option); the
losses of ``objective.policy_losses`` (every policy loss, aggregation mode,
KL penalty and PPO's value loss). Per-rollout statistics in Adam's metric
(``gradstats.group_moments(metric=...)``) do not factor this way and stay on
the vmap path.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

from cbs_jax import noise
from cbs_jax import objective
from cbs_jax import rl
from cbs_jax import scoring

Array = jax.Array

_BIASES = ("bq", "bk", "bv")


def _tapped(graphdef, params, tokens, positions, mask, perturbations=None):
  """The model's forward with its taps on, under ``nnx.capture``."""
  m = nnx.merge(graphdef, params)
  m.set_attributes(capture_taps=True)
  fwd = lambda mod: mod(tokens, positions, mask)
  if perturbations is None:
    return nnx.capture(fwd, nnx.Perturbation)(m)
  return nnx.capture(fwd, nnx.Intermediate, init=perturbations)(m)


def tap_gradients(params, graphdef, batch, rl_spec: rl.RLSpec, sampling_spec: scoring.SamplingSpec):
  """One forward + backward of the batch loss with respect to the taps.

  Returns ``(tokens_BxT, dy, xs, loss)``: ``dy`` maps a parameter-use path
  (module path + parameter name, e.g. ``("blocks", 0, "attn", "wq")``) to
  dL/dy of that use's output, ``xs`` maps ``path[:-1] + (name + "_in",)`` to
  its input, both with leading [B, T]."""
  counts = objective.counts_of(batch)
  tokens, positions, mask = scoring.teacher_forcing_inputs(
      batch["prompt"], batch["prompt_mask"], batch["completion"], batch["completion_mask"]
  )
  shapes = jax.eval_shape(lambda p: _tapped(graphdef, p, tokens, positions, mask)[1], params)
  zeros = jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), shapes)
  Tp = batch["prompt"].shape[1]

  def loss(pert):
    out, inter = _tapped(graphdef, params, tokens, positions, mask, pert)
    sc = scoring.score_from_output(
        out, Tp, batch["completion"], batch["completion_mask"], sampling_spec
    )
    L_B, _ = objective.policy_losses(sc.logprobs, batch, counts, rl_spec, sc.values)
    L = jnp.sum(L_B)
    return L, (inter, L)

  grads, (inter, L) = jax.grad(loss, has_aux=True)(zeros)
  dy = {k: v.get_value() for k, v in nnx.to_flat_state(grads)}
  xs = {k: v.get_value()[0] for k, v in nnx.to_flat_state(inter)}
  return tokens, dy, xs, L


def _param_paths(params) -> list[tuple]:
  """Module path + name of every parameter leaf, in ``jax.tree.leaves`` order."""
  flat, _ = jax.tree_util.tree_flatten_with_path(params)
  out = []
  for path, _ in flat:
    keys = tuple(getattr(k, "key", getattr(k, "idx", getattr(k, "name", k))) for k in path)
    out.append(keys[:-1] if keys and keys[-1] == "value" else keys)
  return out


def _uses(path, tokens, dy, xs):
  """[(kind, a, b)] for the uses of parameter ``path`` (module doc): kind
  "dense" (grad = sum_t a_t (x) b_t), "ids" (a = token ids: one-hot rows),
  "diag" (grad = sum over all but the last axis of a * b), "bias" (grad =
  sum over tokens of b)."""
  name, mod = path[-1], path[:-1]
  f32 = lambda x: x.astype(jnp.float32)
  if path == ("embed",):
    uses = [("ids", tokens, f32(dy[path]))]
    if ("embed_head",) in dy:  # tied: logits = h E^T, grad_E = dlogits^T h
      uses.append(("dense", f32(dy[("embed_head",)]), f32(xs[("embed_head_in",)])))
    return uses
  if path not in dy:
    raise ValueError(
        f"parameter {'/'.join(map(str, path))} has no ghost-norm tap "
        "(model.Tapped); use gradstats.group_moments for this model"
    )
  if name in _BIASES:
    return [("bias", None, f32(dy[path]))]
  x = f32(xs[mod + (name + "_in",)])
  if name == "scale":
    return [("diag", x, f32(dy[path]))]
  return [("dense", x, f32(dy[path]))]


def _rows(a, G: int, width_axes: bool = True):
  """[B, T, ...] -> [G, rows per group, features] (ids: [G, rows])."""
  if a is None:
    return None
  if not width_axes:
    return a.reshape(G, -1)
  B, T = a.shape[:2]
  return a.reshape(G, (B * T) // G, -1)


def _group_grads(uses, G: int, shape) -> Array:
  """Each group's gradient of the leaf, [G, *shape] (formed explicitly)."""
  total = 0.0
  for kind, a, b in uses:
    if kind == "dense":
      g = jnp.einsum("gli,glo->gio", _rows(a, G), _rows(b, G))
    elif kind == "ids":
      ids, bb = _rows(a, G, False), _rows(b, G)
      V = shape[0]
      g = jnp.zeros((G, V, bb.shape[-1]), jnp.float32).at[jnp.arange(G)[:, None], ids].add(bb)
    elif kind == "diag":
      D = a.shape[-1]
      g = jnp.sum((a * b).reshape(G, -1, D), axis=1)
    else:  # bias: sum over the group's tokens
      B, T = b.shape[:2]
      g = jnp.sum(b.reshape((G, (B * T) // G) + b.shape[2:]), axis=1)
    total = total + g.reshape((G,) + tuple(shape))
  return total


def _gram_a(u, v, G):
  """[G, L, L] Gram of the 'a' factors of two outer-product uses."""
  (ku, au, _), (kv, av, _) = u, v
  if ku == "ids" and kv == "ids":
    iu, iv = _rows(au, G, False), _rows(av, G, False)
    return (iu[:, :, None] == iv[:, None, :]).astype(jnp.float32)
  if ku == "ids":  # one-hot(tok_t) . a_v[s] = a_v[s, tok_t]
    iu, dv = _rows(au, G, False), _rows(av, G)
    return jnp.swapaxes(jnp.take_along_axis(dv, iu[:, None, :], axis=2), 1, 2)
  if kv == "ids":
    return jnp.swapaxes(_gram_a(v, u, G), 1, 2)
  return jnp.einsum("gti,gsi->gts", _rows(au, G), _rows(av, G))


def _materializes(uses, G: int, shape, form: str) -> bool:
  """Whether a leaf's squared norms over G groups are taken from the groups'
  gradients formed explicitly (``_group_grads``) rather than Gram sums:
  always for norm scales and biases, never under form "gram" otherwise,
  always under "materialize", and under "auto" when forming them is no more
  work (din x dout <= rows x (din + dout))."""
  size = 1
  for n in shape:
    size *= int(n)
  kinds = {k for k, _, _ in uses}
  B, T = uses[0][2].shape[:2]
  L = (B * T) // G
  width = sum(
      (1 if k == "ids" else a.reshape(B, T, -1).shape[-1]) + b.reshape(B, T, -1).shape[-1]
      for k, a, b in uses
      if k in ("dense", "ids")
  )
  return bool(
      kinds & {"diag", "bias"} or form == "materialize" or (form == "auto" and size <= L * width)
  )


def _gram_sqnorms(uses, G: int) -> Array:
  """|gradient of the leaf summed over each group's rows|^2, [G], by Gram
  sums (every use factors: dense or ids)."""
  out = 0.0
  for i, u in enumerate(uses):
    for j, v in enumerate(uses):
      if j < i:
        continue
      gb = jnp.einsum("gto,gso->gts", _rows(u[2], G), _rows(v[2], G))
      term = jnp.sum(_gram_a(u, v, G) * gb, axis=(1, 2))
      out = out + (term if i == j else 2.0 * term)
  return out


def _sqnorms(g) -> Array:
  """Squared norm of each g[i], [G]."""
  flat = g.reshape(g.shape[0], -1)
  return jnp.sum(flat * flat, axis=-1)


def _leaf_moments(uses, P: int, K: int, shape, form: str):
  """One leaf's (|grad L_i|^2 [N], |sum of prompt p's rollout grads|^2 [P],
  grad L). Finest level first: once a level's group gradients are formed,
  the coarser levels' gradients are their sums (a reshape and a sum, not
  another contraction over the tokens), so the batch gradient costs a
  weight-gradient contraction only where no level was formed."""
  N = P * K
  formed = None  # the per-prompt gradients [P, *shape], once formed
  if _materializes(uses, N, shape, form):
    g_n = _group_grads(uses, N, shape)
    per_rollout = _sqnorms(g_n)
    formed = jnp.sum(g_n.reshape((P, K) + tuple(shape)), axis=1)
  else:
    per_rollout = _gram_sqnorms(uses, N)
  if formed is None and _materializes(uses, P, shape, form):
    formed = _group_grads(uses, P, shape)
  if formed is None:
    return per_rollout, _gram_sqnorms(uses, P), _group_grads(uses, 1, shape)[0]
  return per_rollout, _sqnorms(formed), jnp.sum(formed, axis=0)


FORMS = ("auto", "gram", "materialize")


def moments_and_grad(
    params,
    graphdef,
    batch,
    P: int,
    K: int,
    rl_spec: rl.RLSpec,
    sampling_spec: scoring.SamplingSpec,
    form: str = "auto",
):
  """``(GroupMoments, grad, loss)`` from one forward + backward: the moments
  of ``gradstats.group_moments`` (arrays with a leading per-leaf axis, leaves
  in ``jax.tree.leaves(params)`` order), the batch gradient (= mean of the
  per-rollout gradients, a pytree like ``params``) and the batch loss.

  ``form``: "auto" (per parameter and grouping the cheaper exact form),
  "gram" (Gram sums wherever a use factors) or "materialize" (form every
  group's gradient); the same numbers up to float rounding."""
  if form not in FORMS:
    raise ValueError(f"form={form!r} not in {list(FORMS)}")
  B = batch["completion"].shape[0]
  for name, v in (("P", P), ("K", K)):
    if isinstance(v, bool) or not isinstance(v, int) or v <= 0:
      raise ValueError(f"{name} must be a positive integer, got {v!r}")
  if P * K != B:
    raise ValueError(f"P * K = {P} * {K} = {P * K} does not match the batch's {B} rollouts")
  N = P * K
  tokens, dy, xs, loss = tap_gradients(params, graphdef, batch, rl_spec, sampling_spec)
  leaves, treedef = jax.tree.flatten(params)
  sq, msq, bsq, grads = [], [], [], []
  for path, leaf in zip(_param_paths(params), leaves):
    uses = _uses(path, tokens, dy, xs)
    per_rollout, per_prompt, g = _leaf_moments(uses, P, K, leaf.shape, form)
    sq.append((N * N) * per_rollout.reshape(P, K).sum(-1))  # from |grad L_i|^2
    msq.append(((N / K) ** 2) * per_prompt)
    bsq.append(jnp.sum(g * g))  # g = grad L
    grads.append(g.astype(leaf.dtype))
  moments = noise.GroupMoments(
      sum_sqnorm_P=jnp.stack(sq),
      mean_sqnorm_P=jnp.stack(msq),
      batch_mean_sqnorm=jnp.stack(bsq),
      K=K,
  )
  return moments, jax.tree.unflatten(treedef, grads), loss


def group_moments(
    params,
    graphdef,
    batch,
    P: int,
    K: int,
    rl_spec: rl.RLSpec,
    sampling_spec: scoring.SamplingSpec,
    form: str = "auto",
) -> noise.GroupMoments:
  """Exact per-rollout ``noise.GroupMoments`` (as ``gradstats.group_moments``,
  without a metric) from one forward + backward; see the module doc."""
  return moments_and_grad(params, graphdef, batch, P, K, rl_spec, sampling_spec, form)[0]
