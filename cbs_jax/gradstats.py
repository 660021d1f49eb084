"""Gradient statistics of a rollout batch: the model side of ``noise.py``.

Two instruments, both per parameter leaf so that noise can be broken down by
parameter group (embeddings, attention, MLP, norms, head):

* ``split_grads``: the training gradient computed as an m x n grid of
  microbatches (prompt parts x rollout parts), returning both their mean
  (exactly the batch gradient) and the per-leaf ``SplitMoments``. Nearly
  free: the same FLOPs as one batch gradient.
* ``group_moments``: exact per-rollout gradients ``g_i = N * grad L_i`` with
  ``jax.vmap(jax.grad)`` over a chunk of prompts (all K rollouts of each),
  streamed with ``lax.map`` over chunks and reduced on the fly to per-prompt
  sums of squared norms, per-prompt mean-gradient norms and the running sum
  of prompt means: memory O(chunk x params), never N x params.

Batches are dicts of arrays with leading dim B = P*K, prompt-major (rollout
b = p*K + k); ``objective.rollout_losses`` supplies the per-rollout terms.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import optax

from cbs_jax import ghost
from cbs_jax import noise
from cbs_jax import objective
from cbs_jax import rl
from cbs_jax import scoring

Array = jax.Array

PARAM_GROUPS = ("embeddings", "attention", "mlp", "norms", "head")


def param_group(path: str) -> str:
  """Parameter group of a leaf path such as 'blocks/0/attn/wq'."""
  if "norm" in path:
    return "norms"
  if "/attn/" in f"/{path}/":
    return "attention"
  if "/mlp/" in f"/{path}/":
    return "mlp"
  if path.startswith("embed"):
    return "embeddings"
  return "head"


def leaf_paths(params) -> list[str]:
  flat, _ = jax.tree_util.tree_flatten_with_path(params)
  return ["/".join(str(getattr(k, "key", getattr(k, "idx", k))) for k in p) for p, _ in flat]


def _grid(x: Array, P: int, K: int, m: int, n: int) -> Array:
  """[P*K, ...] -> [m, n, (P/m)*(K/n), ...]: prompt part a, rollout part b."""
  rest = x.shape[1:]
  x = x.reshape((m, P // m, n, K // n) + rest)
  x = jnp.moveaxis(x, 2, 1)  # m, n, P/m, K/n, ...
  return x.reshape((m, n, (P // m) * (K // n)) + rest)


def _loss_sum(
    params, graphdef, batch, counts, rl_spec: rl.RLSpec, sampling_spec: scoring.SamplingSpec
):
  return objective.batch_loss(params, graphdef, batch, counts, rl_spec, sampling_spec)


def adam_state(opt_state):
  """The one ``optax.ScaleByAdamState`` inside ``opt_state``, or None."""
  is_adam = lambda x: isinstance(x, optax.ScaleByAdamState)
  found = [s for s in jax.tree.leaves(opt_state, is_leaf=is_adam) if is_adam(s)]
  return found[0] if len(found) == 1 else None


def adam_metric(opt_state, b2: float, eps: float, grad=None):
  """Adam's preconditioner ``1 / (sqrt(nu_hat) + eps)`` per parameter, from
  the (single) ``optax.ScaleByAdamState`` in ``opt_state``, as a pytree like
  the parameters; None where there is none.

  With ``grad`` (this update's gradient) it is the preconditioner Adam's
  update applies: nu_t = b2 nu + (1 - b2) grad^2, bias-corrected with the
  step count after this update, exactly as ``optax.scale_by_adam`` does.
  Defined from the first step and bounded (nu_t >= (1 - b2) grad^2): the
  metric taken before the update (``grad`` None; nu_hat from past steps
  only) is undefined at the first step and, over the next ~1 / (1 - b2)
  steps, huge on coordinates that have barely had a gradient -- preconditioned
  traces 10^4x their later level, which a tracker's EMA then carries.

  Noise "in Adam's metric" is the noise of the preconditioned direction
  u = D g, D = diag(metric): tr(D Sigma D) / |D G|^2. Multiplying every
  (per-rollout or microbatch) gradient by D and applying the same unbiased
  estimators gives it when D is fixed within a batch; with ``grad`` D
  depends on the batch through its (1 - b2) share of nu_t, a bias of that
  order (docs/noise.md, "Noise in Adam's metric"). It ignores that nu moves
  over steps and Adam's momentum, which averages over steps.
  """
  st = adam_state(opt_state)
  if st is None:
    return None
  if grad is None:
    count = jnp.maximum(st.count, 1).astype(jnp.float32)
    nu = st.nu
  else:
    count = (st.count + 1).astype(jnp.float32)
    nu = jax.tree.map(lambda v, g: b2 * v + (1.0 - b2) * jnp.square(g), st.nu, grad)
  corr = 1.0 - b2**count
  return jax.tree.map(lambda v: 1.0 / (jnp.sqrt(v / corr) + eps), nu)


def _scaled(tree, metric, lead: int):
  """``tree * metric`` leafwise; ``tree`` leaves carry ``lead`` extra leading axes."""
  return jax.tree.map(lambda t, d: t * d.reshape((1,) * lead + d.shape), tree, metric)


def grid_quarters(per_rollout, P: int, K: int, m: int = 2, n: int = 2):
  """Microbatch means q_ab ([m, n, ...] per leaf) of per-rollout values
  (leading axis P*K, prompt-major): the public form of the split grid, for
  feeding ``noise.split_moments_from_quarters`` from per-rollout gradients."""
  return jax.tree.map(lambda x: jnp.mean(_grid(x, P, K, m, n), axis=2), per_rollout)


def split_grads(
    params,
    graphdef,
    batch,
    P: int,
    K: int,
    rl_spec: rl.RLSpec,
    sampling_spec: scoring.SamplingSpec,
    m: int = 2,
    n: int = 2,
    metric=None,
    cells: str = "auto",
):
  """Gradient of the batch loss as an m x n microbatch grid.

  Returns ``(loss, grad, aux, moments)``: ``grad`` is exactly the batch
  gradient (mean of the cell gradients q_ab, each the mean per-rollout
  gradient of its cell), ``aux`` the per-token aux in batch order, and
  ``moments`` a ``noise.SplitMoments`` whose fields have a leading
  per-leaf axis (sum over it for the whole model). With a ``metric`` (a
  pytree like the parameters, e.g. ``adam_metric``, or a function of the
  batch gradient returning one, e.g. ``adam_metric`` with ``grad``)
  ``moments`` is the pair (raw moments, moments of the metric-scaled cell
  gradients). ``cells``: how the cell gradients are computed
  (``cell_grads``); the same numbers up to float rounding.
  """
  losses, q, aux = cell_grads(
      params, graphdef, batch, P, K, rl_spec, sampling_spec, m, n, cells=cells
  )
  grad = jax.tree.map(cell_mean, q)

  # aux back to batch order: [m, n, (P/m)(K/n), T] -> [P*K, T]
  def ungrid(x):
    x = x.reshape((m, n, P // m, K // n) + x.shape[3:])
    return jnp.moveaxis(x, 1, 2).reshape((P * K,) + x.shape[4:])

  aux = jax.tree.map(ungrid, aux)
  moments = _leaf_split_moments(q, P, K)
  if metric is not None:
    d = metric(grad) if callable(metric) else metric
    moments = (moments, _leaf_split_moments(_scaled(q, d, 2), P, K))
  return jnp.sum(losses), grad, aux, moments


def cell_mean(q: Array) -> Array:
  """Mean of an [m, n, ...] leaf over its cell axes (the batch gradient from
  the cells' q_ab), as adds of its slices (``noise.cell_sum``)."""
  m, n = q.shape[:2]
  return noise.cell_sum([q[a, b] for a in range(m) for b in range(n)]) / (m * n)


CELL_FORMS = ("auto", "separate", "vmapped")
# Token rows per cell from which the CPU's separate cells run faster than the
# vmapped ones; below it they run no faster and still cost more compilation
# per program (docs/noise.md, "Split-microbatch estimator").
SEPARATE_MIN_ROWS = 640


def cell_rows(batch, P: int, K: int, m: int = 2, n: int = 2) -> int:
  """Token rows in one cell of the m x n grid: (P K / m n) rollouts of the
  batch's prompt + completion length."""
  return (P * K) // (m * n) * (batch["prompt"].shape[1] + batch["completion"].shape[1])


def cell_form(cells: str, rows_per_cell: int, devices: int = 1) -> str:
  """The form ``cell_grads`` computes its cells in: "separate", "vmapped",
  or "platform" (separate on the CPU, vmapped on every other platform).
  ``cells="auto"`` takes "platform" for cells of at least
  ``SEPARATE_MIN_ROWS`` token rows on one device, and "vmapped" below or
  where the batch may be sharded over ``devices`` > 1 (separate cells made
  XLA gather rows between devices); "separate" and "vmapped" force one form
  on every platform."""
  if cells not in CELL_FORMS:
    raise ValueError(f"cells={cells!r} not in {list(CELL_FORMS)}")
  if cells != "auto":
    return cells
  return "platform" if rows_per_cell >= SEPARATE_MIN_ROWS and devices == 1 else "vmapped"


def cell_grads(params, graphdef, batch, P, K, rl_spec, sampling_spec, m=2, n=2, cells="auto"):
  """The m x n grid's cell gradients, before any moment (arguments as
  ``split_grads``'s): ``(losses, q, aux)`` with ``losses`` [m, n] (each
  cell's summed loss), ``q`` the cell gradients q_ab (leaves [m, n, ...],
  ``split_grads``) and ``aux`` the per-token aux in grid order
  [m, n, (P/m)(K/n), T]. ``cells`` picks their form (``cell_form``)."""
  form = cell_form(cells, cell_rows(batch, P, K, m, n), jax.device_count())
  counts = objective.counts_of(batch)
  grid = jax.tree.map(lambda x: _grid(x, P, K, m, n), batch)
  scale = m * n  # q_ab = (N / |cell|) * grad(sum_{i in cell} L_i) = m*n*grad(...)

  def cell_grad(cell):
    (loss, aux), g = jax.value_and_grad(_loss_sum, has_aux=True)(
        params, graphdef, cell, counts, rl_spec, sampling_spec
    )
    return loss, jax.tree.map(lambda t: scale * t, g), aux

  separate = functools.partial(_cells_separate, cell_grad, m, n)
  vmapped = functools.partial(_cells_vmapped, cell_grad)
  if form == "platform":
    return jax.lax.platform_dependent(grid, cpu=separate, default=vmapped)
  return separate(grid) if form == "separate" else vmapped(grid)


def _cells_separate(cell_grad, m: int, n: int, cells):
  """The CPU's form for large cells: m*n separate gradients in one program,
  which XLA's CPU runtime runs side by side on its threads, where the
  vmapped cells' batched contractions cost up to 11% over a plain gradient
  (docs/noise.md, "Split-microbatch estimator")."""
  outs = [cell_grad(jax.tree.map(lambda x: x[a, b], cells)) for a in range(m) for b in range(n)]
  return jax.tree.map(lambda *xs: jnp.stack(xs).reshape((m, n) + xs[0].shape), *outs)


def _cells_vmapped(cell_grad, cells):
  """Every other platform's form, and the CPU's for small cells: one
  gradient vmapped over the cells (big batched kernels; with the batch
  sharded over a mesh, each device keeps its cells' rows, where separate
  cells cost XLA extra all-gathers and all-to-alls)."""
  return jax.vmap(jax.vmap(cell_grad))(cells)


def _leaf_split_moments(q, P, K):
  per_leaf = [noise.split_moments_from_quarters(leaf, P, K) for leaf in jax.tree.leaves(q)]
  return jax.tree.map(lambda *xs: jnp.stack(xs), *per_leaf)


def per_rollout_grad_fn(graphdef, counts, rl_spec: rl.RLSpec, sampling_spec: scoring.SamplingSpec):
  """``fn(params, rollouts) -> grads`` with a leading rollout axis: grad L_i of
  each rollout's loss term (under the update's global ``counts``), by vmap."""

  def one_loss(p, ex):
    ex1 = jax.tree.map(lambda x: x[None], ex)
    L_B, _ = objective.rollout_losses(p, graphdef, ex1, counts, rl_spec, sampling_spec)
    return L_B[0]

  return jax.vmap(jax.grad(one_loss), in_axes=(None, 0))


EXACT_METHODS = ("vmap", "ghost")


def group_moments(
    params,
    graphdef,
    batch,
    P: int,
    K: int,
    rl_spec: rl.RLSpec,
    sampling_spec: scoring.SamplingSpec,
    chunk_prompts: int,
    metric=None,
    prompt_groups=None,
    num_groups: int = 0,
    method: str = "vmap",
):
  """Exact per-rollout moments, streamed over chunks of ``chunk_prompts``.

  ``method``: "vmap" forms each chunk's per-rollout gradients with
  ``jax.vmap(jax.grad)``; "ghost" gets the same moments from one forward +
  backward of the whole batch (``ghost.group_moments``: Gram sums of the
  model's tapped activations and output gradients, no per-rollout gradient
  formed; ``chunk_prompts`` unused). Adam's ``metric`` and ``prompt_groups``
  need the per-rollout gradients: vmap only.

  Returns a ``noise.GroupMoments`` whose arrays carry a leading per-leaf
  axis ([L, P] and [L]); sum over it for the whole model. With a
  ``metric`` (see ``adam_metric``) the moments are those of the
  metric-scaled per-rollout gradients.

  With ``prompt_groups`` (int labels in [0, num_groups) per prompt, e.g. the
  difficulty) it returns ``(moments, gram)``: ``gram`` [L, G, G] holds, per
  leaf, the inner products S_d . S_e of the per-group sums of prompt-mean
  gradients S_d = sum_{p in d} gbar_p, which ``noise.inter_by_group`` turns
  into each group's share of tr Sigma_inter (memory G x |theta| more).
  """
  if method not in EXACT_METHODS:
    raise ValueError(f"method={method!r} is not one of {list(EXACT_METHODS)}")
  if method == "ghost":
    if metric is not None or prompt_groups is not None:
      raise ValueError(
          "method='ghost' computes raw-gradient moments only: a metric or "
          "prompt_groups needs method='vmap'"
      )
    return ghost.group_moments(params, graphdef, batch, P, K, rl_spec, sampling_spec)
  if P % chunk_prompts:
    raise ValueError(f"chunk_prompts={chunk_prompts} does not divide P={P}")
  counts = objective.counts_of(batch)
  N = P * K
  C = chunk_prompts

  per_rollout_grad = per_rollout_grad_fn(graphdef, counts, rl_spec, sampling_spec)
  chunks = jax.tree.map(lambda x: x.reshape((P // C, C * K) + x.shape[1:]), batch)

  def chunk_stats(chunk):
    g = per_rollout_grad(params, chunk)  # leaves [C*K, ...]
    if metric is not None:
      g = _scaled(g, metric, 1)
    sq, gbar_sq, gbar_sum = [], [], []
    for leaf in jax.tree.leaves(g):
      x = (N * leaf.astype(jnp.float32)).reshape(C, K, -1)
      sq.append(jnp.sum(x * x, axis=(1, 2)))  # [C]
      gb = jnp.mean(x, axis=1)  # [C, D]
      gbar_sq.append(jnp.sum(gb * gb, axis=-1))  # [C]
      gbar_sum.append(jnp.sum(gb, axis=0))  # [D]
    return jnp.stack(sq), jnp.stack(gbar_sq), gbar_sum

  grouped = prompt_groups is not None
  G = int(num_groups) if grouped else 0
  if grouped and G <= 0:
    raise ValueError(f"num_groups={num_groups} must be > 0 with prompt_groups")
  labels = (
      jnp.asarray(prompt_groups, jnp.int32).reshape(P // C, C)
      if grouped
      else jnp.zeros((P // C, C), jnp.int32)
  )

  def body(acc, xs):
    chunk, lab = xs
    gsum_acc, group_acc = acc
    if grouped:  # the same statistics, plus per-group sums of the prompt means
      g = per_rollout_grad(params, chunk)
      if metric is not None:
        g = _scaled(g, metric, 1)
      onehot = jax.nn.one_hot(lab, G, dtype=jnp.float32)  # [C, G]
      gb = [
          jnp.mean((N * l.astype(jnp.float32)).reshape(C, K, -1), axis=1)
          for l in jax.tree.leaves(g)
      ]
      group_acc = [a + onehot.T @ b for a, b in zip(group_acc, gb)]
      sq = jnp.stack(
          [
              jnp.sum(((N * l.astype(jnp.float32)).reshape(C, K, -1)) ** 2, axis=(1, 2))
              for l in jax.tree.leaves(g)
          ]
      )
      gsq = jnp.stack([jnp.sum(b * b, axis=-1) for b in gb])
      gsum = [jnp.sum(b, axis=0) for b in gb]
    else:
      sq, gsq, gsum = chunk_stats(chunk)
    return ([a + b for a, b in zip(gsum_acc, gsum)], group_acc), (sq, gsq)

  sizes = [int(jnp.size(l)) for l in jax.tree.leaves(params)]
  zeros = [jnp.zeros((n,), jnp.float32) for n in sizes]
  gzeros = [jnp.zeros((G, n), jnp.float32) for n in sizes] if grouped else []
  (gsum, gsums), (sq, gsq) = jax.lax.scan(body, (zeros, gzeros), (chunks, labels))
  # sq, gsq: [P/C, L, C] -> [L, P]
  to_LP = lambda a: jnp.moveaxis(a, 1, 0).reshape(a.shape[1], P)
  batch_sq = jnp.stack([jnp.sum((s / P) ** 2) for s in gsum])
  moments = noise.GroupMoments(
      sum_sqnorm_P=to_LP(sq), mean_sqnorm_P=to_LP(gsq), batch_mean_sqnorm=batch_sq, K=K
  )
  if not grouped:
    return moments
  return moments, jnp.stack([s @ s.T for s in gsums])


def sum_leaves(moments, leaf_groups=None):
  """Sum per-leaf moments over all leaves, or per named group.

  ``leaf_groups``: list of group names per leaf; returns a dict group -> moments.
  """
  total = lambda sel: jax.tree.map(lambda a: jnp.sum(a[sel], axis=0), moments)
  if leaf_groups is None:
    return total(slice(None))
  out = {}
  for g in PARAM_GROUPS:
    idx = jnp.array([i for i, lg in enumerate(leaf_groups) if lg == g], jnp.int32)
    if idx.size:
      out[g] = total(idx)
  return out
