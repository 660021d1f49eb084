"""Cost of the gradient-noise instruments vs one plain training gradient.

Command (from the repository root):

    python experiments/bench_noise.py --base_dir=runs/default/sft_base

(without --base_dir the policy is a fresh init, ``model.build(config.model)``:
timings depend only on shapes, fixed by the layout, so both give the same
costs up to noise, but a fresh init solves nothing, every advantage is 0 and
so is every gradient, which makes the cross-checks vacuous (a warning says so).
A --base_dir holding a finished SFT checkpoint is loaded via ``sft.train_sft``.)

Setup: ``configs/default.py`` (arithmetic task, default small model, vocab from
the task tokenizer via ``train.prepare``), P = 16 prompts x K = 16 rollouts =
N = 256 rollouts, one real rollout batch built by ``train._round_batch``
(round 0, on-policy: the first update of a round). Paths, each ``jax.jit``-ed
and warmed up (compile excluded), timed with ``jax.block_until_ready``;
the paths are timed round-robin (one call of each per repeat) so that load
from other processes hits all of them alike; median of --repeats:

* plain  ``jax.value_and_grad(objective.batch_loss)``: one training gradient
  (with the per-token aux the trainer reads; "plain, grad only" drops the
  loss and aux outputs, to show what they cost)
* split  ``gradstats.split_grads`` (2 x 2 microbatch grid + SplitMoments)
* exact  ``gradstats.group_moments`` at ``config.noise.chunk_prompts`` (4),
         and at chunk 1, 2, 16 (the table)
* loop   naive per-example loop: one jitted step per rollout (grad of that
         rollout's ``rollout_losses`` on a batch of 1, GLOBAL counts of the
         batch), accumulating on device the prompt's gradient sum and the
         per-leaf squared norm; 256 + 16 dispatches per pass.

Breakdown of the exact path (to see what it costs):

* vmap-grad only: the same ``lax.scan`` over chunks of ``vmap(grad)``, each
  chunk reduced to a single scalar (sum of squares) -- the per-example
  gradients must still be materialised, but no per-leaf/per-prompt reductions.
* prompt grads: ``vmap`` over prompts of the grad of each prompt's summed loss
  (P gradients of |theta|, what the group means alone need).
* ghost (prototype): the same GroupMoments from ONE forward + backward,
  without per-rollout gradients: the backward is taken w.r.t. zero "taps"
  added to every parameter use's output (dL/dy for all rollouts at once);
  per-rollout squared norms of dense weights then come from the Gram identity
  |sum_t x_t^T dy_t|_F^2 = sum_{t,s} (x_t . x_s)(dy_t . dy_s), and the prompt
  gradients gbar_p from the usual weight-gradient contraction keeping the
  prompt index; their mean is the batch gradient, returned too (so an
  exact-measured update would need no separate plain gradient). It re-writes
  the default model's forward (``make_ghost``); checked against the loop.
  "ghost sqnorms only" is that pass without the prompt gradients.

Memory: XLA's compiled memory analysis of each jitted function,
``jax.jit(f).lower(*args).compile().memory_analysis()``; "temp MB" is
temp_size_in_bytes (scratch the executable allocates besides its arguments
and outputs); the argument and output sizes are printed too. For the loop it
is the analysis of one per-rollout step.

Cross-checks printed: split grad vs plain grad, and every exact variant's
GroupMoments (summed over leaves) vs the loop's (independent computation).

The last line is
    RESULT overhead_vs_plain_grad=<exact/plain> split_overhead=<split/plain> speedup_vs_loop=<loop/exact>
with exact at the config's chunk_prompts.
"""
from __future__ import annotations

import argparse
import importlib.util
import math
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from flax import nnx  # noqa: E402

from cbs_jax import gradstats  # noqa: E402
from cbs_jax import model as model_lib  # noqa: E402
from cbs_jax import noise  # noqa: E402
from cbs_jax import objective  # noqa: E402
from cbs_jax import rl  # noqa: E402
from cbs_jax import sampling  # noqa: E402
from cbs_jax import scoring  # noqa: E402
from cbs_jax import sft  # noqa: E402
from cbs_jax import train  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def load_default_config():
  spec = importlib.util.spec_from_file_location(
      "default_config", os.path.join(ROOT, "configs", "default.py"))
  mod = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(mod)
  return mod.get_config()


def load_params(config, setup, base_dir):
  if not base_dir:
    graphdef, params = model_lib.build(config.model, seed=config.seed)
    return graphdef, params, f"fresh init (model.build, seed {config.seed})"
  ck = os.path.join(base_dir, "checkpoints")
  if not os.path.isdir(ck) or not os.listdir(ck):
    raise SystemExit(f"--base_dir={base_dir!r} holds no SFT checkpoint ({ck})")
  # a finished SFT checkpoint is loaded, not retrained (sft.train_sft returns early)
  graphdef, params, summary = sft.train_sft(config, base_dir, setup.task, setup.tok,
                                            setup.layout, setup.eval_problems)
  return graphdef, params, (f"SFT base {base_dir} (step {summary.get('sft_steps')}, "
                            f"pass@1 {summary.get('base_pass_rate')})")


# ---------------------------------------------------------------------------
# Naive loop: one jitted grad per rollout.
# ---------------------------------------------------------------------------
def make_loop(graphdef, rl_cfg, s_cfg, P, K):
  N = P * K

  def one_loss(params, batch, i, counts):
    ex = {k: jax.lax.dynamic_slice_in_dim(v, i, 1, axis=0) for k, v in batch.items()}
    L_B, _ = objective.rollout_losses(params, graphdef, ex, counts, rl_cfg, s_cfg)
    return L_B[0]

  def step(params, batch, i, counts, acc):
    g = jax.grad(one_loss)(params, batch, i, counts)
    g = [N * x for x in jax.tree.leaves(g)]
    sq = jnp.stack([jnp.sum(x * x) for x in g])          # [L]
    return [a + x for a, x in zip(acc, g)], sq

  step_j = jax.jit(step, donate_argnums=(4,))

  @jax.jit
  def group_sq(acc):
    return jnp.stack([jnp.sum((a / K) ** 2) for a in acc]), [a / K for a in acc]

  def run(params, batch, counts):
    sq_all, gsq_all, gsum = [], [], None
    for p in range(P):
      acc = [jnp.zeros(x.shape, jnp.float32) for x in jax.tree.leaves(params)]
      for k in range(K):
        acc, sq = step_j(params, batch, jnp.int32(p * K + k), counts, acc)
        sq_all.append(sq)
      gsq, gbar = group_sq(acc)
      gsq_all.append(gsq)
      gsum = gbar if gsum is None else [a + b for a, b in zip(gsum, gbar)]
    sum_sq = jnp.stack(sq_all).reshape(P, K, -1).sum(1).T     # [L, P]
    mean_sq = jnp.stack(gsq_all).T                            # [L, P]
    batch_sq = jnp.stack([jnp.sum((s / P) ** 2) for s in gsum])
    return noise.GroupMoments(sum_sqnorm_P=sum_sq, mean_sqnorm_P=mean_sq,
                              batch_mean_sqnorm=batch_sq, K=K)

  return run, step_j


# ---------------------------------------------------------------------------
# Breakdown pieces of the exact path.
# ---------------------------------------------------------------------------
def vmap_grad_only(params, graphdef, batch, P, K, rl_cfg, s_cfg, chunk_prompts):
  """group_moments' scan of vmap(grad), each chunk reduced to ONE scalar."""
  counts = objective.counts_of(batch)
  C = chunk_prompts

  per_rollout_grad = gradstats.per_rollout_grad_fn(graphdef, counts, rl_cfg, s_cfg)
  chunks = jax.tree.map(lambda x: x.reshape((P // C, C * K) + x.shape[1:]), batch)

  def body(acc, chunk):
    g = per_rollout_grad(params, chunk)
    return acc + sum(jnp.sum(x * x) for x in jax.tree.leaves(g)), None

  out, _ = jax.lax.scan(body, jnp.float32(0), chunks)
  return out


def prompt_grads(params, graphdef, batch, P, K, rl_cfg, s_cfg):
  """N * grad of each prompt's summed loss / K = gbar_p, for all p (vmap over P)."""
  counts = objective.counts_of(batch)
  N = P * K

  def group_loss(p, grp):
    L_B, _ = objective.rollout_losses(p, graphdef, grp, counts, rl_cfg, s_cfg)
    return jnp.sum(L_B)

  groups = jax.tree.map(lambda x: x.reshape((P, K) + x.shape[1:]), batch)
  g = jax.vmap(jax.grad(group_loss), in_axes=(None, 0))(params, groups)
  return jax.tree.map(lambda x: (N / K) * x, g)


# ---------------------------------------------------------------------------
# Ghost-norm prototype: per-rollout squared norms without per-rollout grads.
# ---------------------------------------------------------------------------
# The model's forward is re-written here with "taps": every parameter use
# y = f(x, W) gets a zero additive perturbation on its output, so that
# d L_i / d y (for all rollouts at once: L = sum_i L_i, and rollout i's
# tokens only touch rollout i's activations) comes out of ONE batched
# backward pass. For a dense use y_t = x_t W (x_t in R^din, tokens t of one
# rollout), grad_W L_i = sum_t x_t^T dy_t and
#     |grad_W L_i|_F^2 = sum_{t,s} (x_t . x_s)(dy_t . dy_s)
# (T^2 (din + dout) flops instead of T din dout plus a din x dout write).
# Embedding (gather): grad_E L_i = sum_t onehot(tok_t)^T dx_t, so
# |.|^2 = sum_{t,s} [tok_t == tok_s] (dx_t . dx_s). RMSNorm scale:
# grad = sum_t xhat_t * dy_t, materialised per rollout (only d_model wide).
# The forward must equal model.Transformer's (checked: logits and the
# moments against the loop).

def _rms(x, eps=1e-6):
  x32 = x.astype(jnp.float32)
  return x32 * jax.lax.rsqrt(jnp.mean(x32 * x32, -1, keepdims=True) + eps)


def _paths(params):
  """gradstats.leaf_paths without the Variable suffix ('.../wq/.value' -> '.../wq')."""
  return [p.removesuffix("/.value") for p in gradstats.leaf_paths(params)]


def _gram_sq(x_BxTxI, dy_BxTxO, mask_BxT=None):
  """Per-rollout |sum_t x_t^T dy_t|_F^2 via the Gram identity, [B]."""
  gx = jnp.einsum("bti,bsi->bts", x_BxTxI, x_BxTxI)
  gy = jnp.einsum("bto,bso->bts", dy_BxTxO, dy_BxTxO)
  return jnp.sum(gx * gy, axis=(1, 2))


def make_ghost(graphdef, params, rl_cfg, s_cfg, P, K):
  cfg = model_lib.config_of(graphdef, params)
  if cfg.tie_embeddings or cfg.value_head or cfg.dtype != "float32":
    raise ValueError("ghost prototype covers the default model only")
  L, H, KV = cfg.num_layers, cfg.num_heads, cfg.num_kv_heads
  dh = cfg.d_model // H
  N = P * K

  def forward(pp, taps, tokens, positions, kv_mask):
    """model.Transformer.__call__ (cache=None), with taps added to every
    parameter-use output. Returns logits and the inputs x of each use."""
    ins = {}
    x = pp["embed"][tokens] + taps["embed"]
    for i in range(L):
      b, t = pp["blocks"][i], taps["blocks"][i]
      xn = _rms(x)
      ins[f"{i}/attn_norm"] = xn
      h = xn * b["attn_norm"]["scale"] + t["attn_norm"]
      ins[f"{i}/attn_in"] = h
      q = jnp.einsum("btd,dhk->bthk", h, b["attn"]["wq"]) + t["wq"]
      k = jnp.einsum("btd,dhk->bthk", h, b["attn"]["wk"]) + t["wk"]
      v = jnp.einsum("btd,dhk->bthk", h, b["attn"]["wv"]) + t["wv"]
      q = model_lib.rope(q, positions, cfg.rope_theta)
      k = model_lib.rope(k, positions, cfg.rope_theta)
      B, T = tokens.shape
      g = H // KV
      qg = q.reshape(B, T, KV, g, dh)
      sc = jnp.einsum("btkgd,bskd->bkgts", qg, k) / math.sqrt(dh)
      allowed = (jnp.arange(T)[None, :] <= jnp.arange(T)[:, None])[None] & kv_mask[:, None, :]
      sc = jnp.where(allowed[:, None, None], sc, model_lib._NEG_INF)
      pr = jax.nn.softmax(sc, axis=-1)
      o = jnp.einsum("bkgts,bskd->btkgd", pr, v).reshape(B, T, H * dh)
      ins[f"{i}/wo_in"] = o
      x = x + jnp.einsum("btf,fd->btd", o, b["attn"]["wo"].reshape(H * dh, -1)) + t["wo"]
      xn = _rms(x)
      ins[f"{i}/mlp_norm"] = xn
      h = xn * b["mlp_norm"]["scale"] + t["mlp_norm"]
      ins[f"{i}/mlp_in"] = h
      gt = h @ b["mlp"]["w_gate"] + t["w_gate"]
      up = h @ b["mlp"]["w_up"] + t["w_up"]
      a = jax.nn.silu(gt) * up
      ins[f"{i}/down_in"] = a
      x = x + a @ b["mlp"]["w_down"] + t["w_down"]
    xn = _rms(x)
    ins["final_norm"] = xn
    h = xn * pp["final_norm"]["scale"] + taps["final_norm"]
    ins["head_in"] = h
    logits = h @ pp["lm_head"] + taps["lm_head"]
    return logits, ins

  def zero_taps(B, T):
    z = lambda *s: jnp.zeros((B, T) + s, jnp.float32)
    d, f, V = cfg.d_model, cfg.d_ff, cfg.vocab_size
    blk = lambda: dict(attn_norm=z(d), wq=z(H, dh), wk=z(KV, dh), wv=z(KV, dh), wo=z(d),
                       mlp_norm=z(d), w_gate=z(f), w_up=z(f), w_down=z(d))
    return dict(embed=z(d), blocks=[blk() for _ in range(L)], final_norm=z(d),
                lm_head=z(V))

  def loss_from_logits(logits_full, batch, counts):
    """objective.rollout_losses given the model's logits (same code path)."""
    Tp = batch["prompt"].shape[1]
    Tc = batch["completion"].shape[1]
    mask = batch["completion_mask"]
    logits = jax.lax.dynamic_slice_in_dim(logits_full, Tp - 1, Tc, axis=1)
    logp_all = scoring.process_logits(logits, s_cfg.temperature, s_cfg.top_k, s_cfg.top_p)
    logp = jnp.take_along_axis(logp_all, batch["completion"][..., None], -1)[..., 0]
    logp = jnp.where(mask.astype(bool), logp, 0.0)
    logp_old = jnp.where(batch["on_policy"][:, None], jax.lax.stop_gradient(logp),
                         batch["logp_old"])
    loss_BxT, _ = rl.policy_loss(rl_cfg.loss, logp, logp_old, batch["adv"], mask, rl_cfg)
    if rl_cfg.kl_beta:
      loss_BxT = loss_BxT + rl_cfg.kl_beta * mask * rl.kl_penalty(
          logp, batch["logp_ref"], rl_cfg.kl_estimator)
    w = rl.aggregation_weights(mask, rl_cfg.aggregation, counts.num_seqs,
                               counts.num_tokens, counts.max_len)
    return jnp.sum(w * loss_BxT)

  def inputs(batch):
    tokens = jnp.concatenate([batch["prompt"], batch["completion"]], 1)
    mask = jnp.concatenate([batch["prompt_mask"].astype(bool),
                            batch["completion_mask"].astype(bool)], 1)
    return tokens, scoring.positions_from_mask(mask), mask

  def tap_grads(pp, batch):
    """ONE forward + backward w.r.t. the taps: (inputs of each use, dL/dy)."""
    counts = objective.counts_of(batch)
    tokens, pos, mask = inputs(batch)
    pd = nnx.to_pure_dict(pp)
    B, T = tokens.shape

    def f(tp):
      logits, ins = forward(pd, tp, tokens, pos, mask)
      return loss_from_logits(logits, batch, counts), ins

    dy, ins = jax.grad(f, has_aux=True)(zero_taps(B, T))
    return tokens, ins, dy

  def uses(tokens, ins, dy):
    """(leaf path, kind, x, dy) for every parameter use, dy flattened to [B,T,O]."""
    B, T = tokens.shape
    flat = lambda a: a.reshape(B, T, -1)
    out = [("embed", "embed", tokens, dy["embed"])]
    for i in range(L):
      t, p = dy["blocks"][i], f"blocks/{i}"
      out.append((f"{p}/attn_norm/scale", "scale", ins[f"{i}/attn_norm"], t["attn_norm"]))
      for w in ("wq", "wk", "wv"):
        out.append((f"{p}/attn/{w}", "dense", ins[f"{i}/attn_in"], flat(t[w])))
      out.append((f"{p}/attn/wo", "dense", ins[f"{i}/wo_in"], t["wo"]))
      out.append((f"{p}/mlp_norm/scale", "scale", ins[f"{i}/mlp_norm"], t["mlp_norm"]))
      for w in ("w_gate", "w_up"):
        out.append((f"{p}/mlp/{w}", "dense", ins[f"{i}/mlp_in"], t[w]))
      out.append((f"{p}/mlp/w_down", "dense", ins[f"{i}/down_in"], t["w_down"]))
    out.append(("final_norm/scale", "scale", ins["final_norm"], dy["final_norm"]))
    out.append(("lm_head", "dense", ins["head_in"], dy["lm_head"]))
    return {path: (kind, x, g) for path, kind, x, g in out}

  def per_rollout_sq(kind, x, g):
    """|grad_W L_i|^2 for each rollout i, [B], never forming grad_W L_i (dense)."""
    if kind == "embed":
      same = x[:, :, None] == x[:, None, :]
      return jnp.sum(same * jnp.einsum("btd,bsd->bts", g, g), (1, 2))
    if kind == "scale":
      return jnp.sum(jnp.sum(x * g, 1) ** 2, -1)
    return _gram_sq(x, g)

  def per_prompt_grad(kind, x, g, shape):
    """sum over a prompt's K rollouts of grad_W L_i, [P, *shape] (a plain
    weight-gradient contraction that keeps the prompt index)."""
    r = lambda a: a.reshape((P, K) + a.shape[1:])
    if kind == "embed":
      oh = jax.nn.one_hot(x, cfg.vocab_size, dtype=g.dtype)
      out = jnp.einsum("pktv,pktd->pvd", r(oh), r(g))
    elif kind == "scale":
      out = jnp.einsum("pktd,pktd->pd", r(x), r(g))
    else:
      out = jnp.einsum("pkti,pkto->pio", r(x), r(g))
    return out.reshape((P,) + shape)

  def ghost_sqnorms(pp, batch):
    """[L_leaves, N] per-rollout squared norms of g_i = N grad L_i only."""
    tokens, ins, dy = tap_grads(pp, batch)
    u = uses(tokens, ins, dy)
    return (N * N) * jnp.stack([per_rollout_sq(*u[k]) for k in _paths(pp)])

  def ghost_moments(pp, batch):
    """GroupMoments (same fields/leaf order as gradstats.group_moments) and
    the batch gradient, from one forward + backward."""
    tokens, ins, dy = tap_grads(pp, batch)
    u = uses(tokens, ins, dy)
    sq, msq, bsq, grad = [], [], [], []
    for path, leaf in zip(_paths(pp), jax.tree.leaves(pp)):
      kind, x, g = u[path]
      sq.append((N * N) * per_rollout_sq(kind, x, g).reshape(P, K).sum(-1))
      gbar = (N / K) * per_prompt_grad(kind, x, g, leaf.shape)   # [P, ...] = gbar_p
      gb = gbar.reshape(P, -1)
      msq.append(jnp.sum(gb * gb, -1))
      mean = jnp.mean(gbar, 0)
      bsq.append(jnp.sum(mean * mean))
      grad.append(mean)
    grad = jax.tree.unflatten(jax.tree.structure(pp), grad)
    return noise.GroupMoments(sum_sqnorm_P=jnp.stack(sq), mean_sqnorm_P=jnp.stack(msq),
                              batch_mean_sqnorm=jnp.stack(bsq), K=K), grad

  return ghost_moments, ghost_sqnorms


# ---------------------------------------------------------------------------
def mem_analysis(fn, *args):
  m = jax.jit(fn).lower(*args).compile().memory_analysis()
  if m is None:
    return None
  return dict(temp=m.temp_size_in_bytes, arg=m.argument_size_in_bytes,
              out=m.output_size_in_bytes)


def total_moments(m):
  s = gradstats.sum_leaves(m)
  return np.array([np.sum(s.sum_sqnorm_P), np.sum(s.mean_sqnorm_P),
                   float(s.batch_mean_sqnorm)])


def rel(a, b):
  a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
  return float(np.max(np.abs(a - b)) / max(np.max(np.abs(b)), 1e-30))


def main():
  ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  ap.add_argument("--base_dir", default="",
                  help="SFT base workdir (e.g. runs/default/sft_base); empty: fresh init")
  ap.add_argument("--repeats", type=int, default=7, help="timed calls per path (median)")
  ap.add_argument("--loop_repeats", type=int, default=0,
                  help="timed passes of the naive loop (each 256 + 16 dispatches); "
                       "0 = --repeats")
  ap.add_argument("--no_ghost", action="store_true", help="skip the ghost-norm prototype")
  args = ap.parse_args()
  args.loop_repeats = args.loop_repeats or args.repeats

  config = load_default_config()
  setup = train.prepare(config)  # validates, fixes vocab
  P, K = config.batch.num_prompts, config.batch.rollouts_per_prompt
  N = P * K
  C0 = config.noise.chunk_prompts
  rl_cfg, s_cfg = config.rl, config.sampling
  graphdef, params, origin = load_params(config, setup, args.base_dir)
  print(f"jax {jax.__version__} on {jax.devices()[0].platform} ({jax.device_count()} "
        f"device(s)); params {model_lib.param_count(params):,}; P={P} K={K} N={N}; "
        f"layout {setup.layout.prompt_len}+{setup.layout.completion_len} tokens; "
        f"policy: {origin}", flush=True)

  t0 = time.perf_counter()
  batch, rewards, _ = train._round_batch(config, graphdef, params, params, setup, 0)
  batch["on_policy"] = jnp.ones((N,), bool)  # first update of an on-policy round
  batch = {k: batch[k] for k in objective.BATCH_KEYS}
  jax.block_until_ready(batch)
  print(f"rollout batch: {time.perf_counter() - t0:.1f} s, reward mean "
        f"{rewards.mean():.3f}, mixed groups {np.mean(rewards.std(1) > 0):.2f}, "
        f"valid completion tokens {float(batch['completion_mask'].sum()):.0f}", flush=True)
  if not np.any(np.asarray(batch["adv"])):
    print("WARNING: every advantage is 0 (no group has mixed rewards), so every "
          "gradient is 0: timings are valid (fixed shapes), the cross-checks are "
          "vacuous. Use --base_dir=runs/default/sft_base for a real policy.")
  counts = objective.counts_of(batch)

  def plain_fn(p, b):
    return jax.value_and_grad(objective.batch_loss, has_aux=True)(
        p, graphdef, b, objective.counts_of(b), rl_cfg, s_cfg)

  def split_fn(p, b):
    return gradstats.split_grads(p, graphdef, b, P, K, rl_cfg, s_cfg)

  def exact_fn(C):
    return lambda p, b: gradstats.group_moments(p, graphdef, b, P, K, rl_cfg, s_cfg, C)

  def plain_noaux_fn(p, b):
    return jax.grad(lambda q: objective.batch_loss(
        q, graphdef, b, objective.counts_of(b), rl_cfg, s_cfg)[0])(p)

  paths = {"plain": plain_fn, "  plain, grad only (no aux)": plain_noaux_fn,
           "split": split_fn}
  for C in sorted({C0, 1, 2, 16}):
    paths[f"exact c{C}"] = exact_fn(C)
  paths[f"  vmap-grad only c{C0}"] = lambda p, b: vmap_grad_only(
      p, graphdef, b, P, K, rl_cfg, s_cfg, C0)
  paths["  prompt grads (P)"] = lambda p, b: prompt_grads(p, graphdef, b, P, K, rl_cfg, s_cfg)
  ghost = None
  if not args.no_ghost:
    ghost_moments, ghost_sqnorms = make_ghost(graphdef, params, rl_cfg, s_cfg, P, K)
    paths["  ghost sqnorms only"] = ghost_sqnorms
    paths["ghost (prototype)"] = ghost_moments
    ghost = True

  jitted = {name: jax.jit(f) for name, f in paths.items()}
  mem, outs = {}, {}
  for name, f in paths.items():
    t = time.perf_counter()
    mem[name] = mem_analysis(f, params, batch)
    outs[name] = jax.block_until_ready(jitted[name](params, batch))  # compile + warm-up
    print(f"  compiled + warmed {name.strip()}: {time.perf_counter() - t:.1f} s", flush=True)

  loop_run, loop_step = make_loop(graphdef, rl_cfg, s_cfg, P, K)
  acc0 = [jnp.zeros(x.shape, jnp.float32) for x in jax.tree.leaves(params)]
  m = loop_step.lower(params, batch, jnp.int32(0), counts, acc0).compile().memory_analysis()
  mem["loop"] = dict(temp=m.temp_size_in_bytes, arg=m.argument_size_in_bytes,
                     out=m.output_size_in_bytes) if m is not None else None
  loop_mom = jax.block_until_ready(loop_run(params, batch, counts))  # compile + warm-up

  # ---- cross-checks
  (_, _), g_plain = outs["plain"]
  _, g_split, _, _ = outs["split"]
  d_split = max(rel(a, b) for a, b in zip(jax.tree.leaves(g_split), jax.tree.leaves(g_plain)))
  ref = total_moments(loop_mom)
  print(f"check: split grad vs plain grad, max rel diff {d_split:.1e}")
  print(f"check: loop totals [sum_k|g|^2, sum_p|gbar_p|^2, |gbar|^2] = "
        f"{ref[0]:.4e} {ref[1]:.4e} {ref[2]:.4e}")
  for name in paths:
    if name.startswith("exact"):
      print(f"check: {name} moments vs loop, max rel diff "
            f"{rel(total_moments(outs[name]), ref):.1e}")
  if ghost:
    gm, g_ghost = outs["ghost (prototype)"]
    print(f"check: ghost moments vs loop: totals {rel(total_moments(gm), ref):.1e}, "
          f"per-leaf sum_k|g|^2 {rel(gm.sum_sqnorm_P, loop_mom.sum_sqnorm_P):.1e}, "
          f"per-leaf |gbar_p|^2 {rel(gm.mean_sqnorm_P, loop_mom.mean_sqnorm_P):.1e}; "
          f"ghost batch grad vs plain grad "
          f"{max(rel(a, b) for a, b in zip(jax.tree.leaves(g_ghost), jax.tree.leaves(g_plain))):.1e}")
    outs["ghost (prototype)"] = gm
  g_pg = outs["  prompt grads (P)"]
  gb_sum = jax.tree.leaves(jax.tree.map(lambda x: jnp.mean(x, 0), g_pg))
  print(f"check: mean of prompt grads vs plain grad, max rel diff "
        f"{max(rel(a, b) for a, b in zip(gb_sum, jax.tree.leaves(g_plain))):.1e}", flush=True)

  # ---- timing, round-robin
  times = {name: [] for name in paths}
  times["loop"] = []
  for r in range(args.repeats):
    for name in paths:
      t = time.perf_counter()
      jax.block_until_ready(jitted[name](params, batch))
      times[name].append(time.perf_counter() - t)
    if r < args.loop_repeats:
      t = time.perf_counter()
      jax.block_until_ready(loop_run(params, batch, counts))
      times["loop"].append(time.perf_counter() - t)
    print(f"  repeat {r + 1}/{args.repeats}: plain {times['plain'][-1] * 1e3:.1f} ms, "
          f"exact c{C0} {times[f'exact c{C0}'][-1] * 1e3:.1f} ms", flush=True)

  med = {k: float(np.median(v)) for k, v in times.items()}
  base = med["plain"]
  print()
  print("memory: XLA compiled memory_analysis() of each jitted function "
        "(temp = scratch besides args/outputs; loop: one per-rollout step)")
  bmin = min(times["plain"])
  print(f"{'path':<28} {'ms':>9} {'x plain':>8} {'min ms':>9} {'x (min)':>8} "
        f"{'temp MB':>9} {'arg MB':>7} {'out MB':>7}")
  for name in list(paths) + ["loop"]:
    mm = mem.get(name)
    mb = (lambda k: f"{mm[k] / 2**20:.2f}") if mm else (lambda k: "n/a")
    print(f"{name:<28} {med[name] * 1e3:>9.1f} {med[name] / base:>8.2f} "
          f"{min(times[name]) * 1e3:>9.1f} {min(times[name]) / bmin:>8.2f} "
          f"{mb('temp'):>9} {mb('arg'):>7} {mb('out'):>7}")
  print(f"ms = median, x plain = median / plain's median; min ms / x (min): the "
        f"fastest call (least disturbed by other processes), ratio of minima")
  print(f"(median of {args.repeats} calls; loop median of {args.loop_repeats} passes "
        f"of {N} + {P} dispatches = {med['loop'] / (N + P) * 1e3:.2f} ms per dispatch; "
        f"plain / N = {base / N * 1e3:.2f} ms per rollout)")
  ex = med[f"exact c{C0}"]
  print(f"RESULT overhead_vs_plain_grad={ex / base:.3f} "
        f"split_overhead={med['split'] / base:.3f} speedup_vs_loop={med['loop'] / ex:.2f}")


if __name__ == "__main__":
  main()
