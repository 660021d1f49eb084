"""Tests for cbs_jax.sampling.

Independent references: teacher-forced ``score`` (one full forward, no cache)
for the sampler's behaviour log-probs; a numpy float64 implementation of
temperature / top-k / top-p; a naive greedy loop that recomputes the full
forward every step; and the empirical frequency of many sampled tokens
against the exact probabilities (chi-square and a per-token 5-sigma bound).
Tiny model (d_model 32, 2 layers, vocab 20).
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy import stats

from cbs_jax import model, sampling, scoring

from tiny import VOCAB
from tiny import tiny_config as _tiny_config

PAD = 0


def tiny_config(**overrides):
  return _tiny_config(max_len=24, **overrides)


@pytest.fixture(scope="module")
def tiny():
  gd, params = model.build(tiny_config(), seed=0)
  return gd, params


_fwd = jax.jit(model.apply, static_argnums=0)
_score_jit = jax.jit(scoring.score, static_argnums=(0, 6))


def _score(gd, params, toks, mask, comp, cmask, **proc):
  """``scoring.score`` (jitted) under the spec of ``proc`` (temperature, top_k, top_p)."""
  return _score_jit(gd, params, toks, mask, comp, cmask, scoring.SamplingSpec(**proc))


def random_prompts(lengths, seed=0):
  rng = np.random.default_rng(seed)
  return [list(rng.integers(1, VOCAB, n)) for n in lengths]


MIXED = [5, 2, 8, 1, 6, 3, 7, 4]  # mixed prompt lengths, left-padded to 8


def mixed_batch(seed=1):
  return sampling.left_pad(random_prompts(MIXED, seed), max(MIXED), PAD)


def spec_kw(kw):
  """``kw`` with its temperature / top_k / top_p (if any) as a ``spec``."""
  proc = {k: kw.pop(k) for k in ("temperature", "top_k", "top_p") if k in kw}
  return dict(kw, spec=scoring.SamplingSpec(**proc))


def gen(gd, params, toks, mask, key=0, **kw):
  kw.setdefault("pad_id", PAD)
  if isinstance(key, int):
    key = jax.random.key(key)
  out = sampling.generate(gd, params, toks, mask, key, **spec_kw(kw))
  return jax.tree.map(np.asarray, out)


N_NEW = 12  # completion length of the shared mixed-batch cases (one compile each)


@pytest.fixture(scope="module")
def eos(tiny):
  """A frequent token, used as EOS so that some sequences stop early: the one of
  highest mean next-token probability after the mixed-batch prompts. One EOS
  for the whole module keeps the number of compiled samplers small."""
  gd, params = tiny
  toks, mask = mixed_batch()
  lg = _fwd(
      gd,
      params,
      jnp.asarray(toks),
      scoring.positions_from_mask(jnp.asarray(mask)),
      jnp.asarray(mask),
  ).logits[:, -1]
  p = np.asarray(jax.nn.softmax(lg, -1)).mean(0)
  p[PAD] = 0
  return int(np.argmax(p))


# ---------------------------------------------------------------------------
# process_logits against numpy
# ---------------------------------------------------------------------------


def np_process(logits, temperature=1.0, top_k=0, top_p=1.0):
  """Float64 reference: probabilities after temperature, then top-k (ties with
  the k-th value kept), then top-p: walking the tokens in descending
  probability, keep each while the mass already kept is < top_p (ties with the
  last kept token kept), and renormalise."""
  x = np.asarray(logits, np.float64) / temperature
  out = np.zeros_like(x)
  for idx in np.ndindex(x.shape[:-1]):
    row = x[idx]
    keep = np.ones(row.shape, bool)
    if top_k and top_k < row.size:
      kth = np.sort(row)[::-1][top_k - 1]
      keep &= row >= kth
    p = np.where(keep, np.exp(row - row[keep].max()), 0.0)
    p /= p.sum()
    if top_p < 1.0:
      order = np.argsort(-p, kind="stable")
      before = 0.0
      nucleus = np.zeros(row.shape, bool)
      thresh = None
      for j in order:
        if before < top_p:
          nucleus[j] = True
          thresh = p[j]
        before += p[j]
      nucleus |= p >= thresh  # ties with the last kept token are kept
      p = np.where(nucleus, p, 0.0)
      p /= p.sum()
    out[idx] = p
  return out


@pytest.mark.parametrize(
    "temperature,top_k,top_p",
    [
        (1.0, 0, 1.0),
        (0.5, 0, 1.0),
        (2.0, 0, 1.0),
        (1.0, 3, 1.0),
        (1.0, 1, 1.0),
        (1.0, 0, 0.6),
        (1.0, 0, 0.05),
        (0.7, 5, 0.8),
        (1.3, 4, 0.9),
        (1.0, VOCAB, 1.0),
    ],
)
def test_process_logits_matches_numpy(temperature, top_k, top_p):
  logits = np.random.default_rng(0).normal(size=(6, VOCAB)) * 2.0
  got = np.exp(
      np.asarray(
          scoring.process_logits(
              jnp.asarray(logits, jnp.float32), scoring.SamplingSpec(temperature, top_k, top_p)
          ),
          np.float64,
      )
  )
  want = np_process(logits.astype(np.float32), temperature, top_k, top_p)
  np.testing.assert_allclose(got, want, atol=2e-6, rtol=0)
  np.testing.assert_allclose(got.sum(-1), 1.0, atol=1e-5)


def test_process_logits_keeps_ties():
  x = jnp.array([[1.0, 2.0, 2.0, 0.0]])
  p = np.exp(np.asarray(scoring.process_logits(x, scoring.SamplingSpec(top_k=1))))
  np.testing.assert_allclose(p, [[0, 0.5, 0.5, 0]], atol=1e-7)
  p = np.exp(np.asarray(scoring.process_logits(x, scoring.SamplingSpec(top_p=0.3))))
  np.testing.assert_allclose(p[0, [0, 3]], 0.0, atol=1e-7)
  np.testing.assert_allclose(p[0, 1], p[0, 2], atol=1e-7)


# ---------------------------------------------------------------------------
# Behaviour log-probs == teacher-forced score
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("temperature,top_k,top_p", [(1.0, 0, 1.0), (0.7, 5, 0.8)])
def test_behaviour_logprobs_equal_score(tiny, eos, temperature, top_k, top_p):
  gd, params = tiny
  toks, mask = mixed_batch()
  n_new = N_NEW
  proc = dict(temperature=temperature, top_k=top_k, top_p=top_p)
  out = gen(gd, params, toks, mask, key=7, max_new_tokens=n_new, eos_id=eos, **proc)
  # the case is interesting only if EOS cut some sequences short and not others
  assert (out.lengths < n_new).any(), out.lengths
  assert (out.lengths == n_new).any() or (out.lengths < n_new).all()
  assert len(set(out.lengths.tolist())) > 1, out.lengths
  sc = _score(
      gd,
      params,
      jnp.asarray(toks),
      jnp.asarray(mask),
      jnp.asarray(out.tokens),
      jnp.asarray(out.mask),
      **proc,
  )
  diff = np.abs(np.asarray(sc.logprobs) - out.logprobs)
  assert diff.max() <= 1e-4, diff.max()
  assert np.all(out.logprobs[out.mask == 0] == 0.0)
  assert np.all(out.logprobs[out.mask > 0] <= 0.0)
  assert np.all(out.logprobs[out.mask > 0] > -50.0)  # never a masked-out token
  # score's processed logits give the same log-prob of every sampled token
  lp = np.take_along_axis(np.asarray(sc.logits), out.tokens[..., None], -1)[..., 0]
  np.testing.assert_allclose(lp[out.mask > 0], out.logprobs[out.mask > 0], atol=1e-4)


def test_score_values_with_value_head():
  gd, params = model.build(tiny_config(value_head=True), 0)
  toks, mask = mixed_batch()
  rng = np.random.default_rng(0)
  comp = rng.integers(0, VOCAB, (toks.shape[0], 6)).astype(np.int32)
  lengths = rng.integers(1, 7, toks.shape[0])
  cmask = (np.arange(6)[None] < lengths[:, None]).astype(np.float32)
  sc = _score(
      gd, params, jnp.asarray(toks), jnp.asarray(mask), jnp.asarray(comp), jnp.asarray(cmask)
  )
  assert sc.values.shape == comp.shape
  full_tokens = np.concatenate([toks, comp], 1)
  full_mask = np.concatenate([mask, cmask > 0], 1)
  o = model.apply(
      gd,
      params,
      jnp.asarray(full_tokens),
      scoring.positions_from_mask(jnp.asarray(full_mask)),
      jnp.asarray(full_mask),
  )
  Tp = toks.shape[1]
  # the value "before" completion token t is read at the position before it
  np.testing.assert_allclose(
      np.asarray(sc.values), np.asarray(o.values[:, Tp - 1 : Tp - 1 + comp.shape[1]]), atol=1e-6
  )


def test_greedy_equals_naive_full_recompute(tiny):
  """top_k=1 decoding == argmax of a full forward over [prompt + generated]."""
  gd, params = tiny
  toks, mask = mixed_batch(seed=3)
  n_new = 10
  B, Tp = toks.shape
  buf = np.concatenate([toks, np.full((B, n_new), PAD, np.int32)], 1)
  bmask = np.concatenate([mask, np.zeros((B, n_new), bool)], 1)
  fwd = jax.jit(model.apply, static_argnums=0)
  for t in range(n_new):
    lg = fwd(
        gd,
        params,
        jnp.asarray(buf),
        scoring.positions_from_mask(jnp.asarray(bmask)),
        jnp.asarray(bmask),
    ).logits
    buf[:, Tp + t] = np.argmax(np.asarray(lg[:, Tp + t - 1]), -1)
    bmask[:, Tp + t] = True
  unused = [v for v in range(VOCAB) if v not in buf[:, Tp:]]
  assert unused  # an EOS the greedy path never emits, so all rows run n_new steps
  out = gen(gd, params, toks, mask, max_new_tokens=n_new, eos_id=unused[0], top_k=1)
  np.testing.assert_array_equal(out.tokens, buf[:, Tp:])
  np.testing.assert_array_equal(out.mask, 1.0)
  np.testing.assert_allclose(out.logprobs, 0.0, atol=1e-6)  # top-1: probability 1

  # Staggered early exit: an EOS that every row's greedy path reaches in its
  # first few tokens, at different steps; the sampler must stop each row there.
  greedy = buf[:, Tp:]
  first = [
      min([t for t in range(n_new) if greedy[i, t] == v], default=n_new)
      for v in range(VOCAB)
      for i in range(B)
  ]
  first = np.array(first).reshape(VOCAB, B)
  v = int(np.argmin(first.max(1)))
  hit = first[v] < n_new
  assert hit.sum() >= 2
  out = gen(gd, params, toks, mask, max_new_tokens=n_new, eos_id=v, top_k=1)
  _check_well_formed(out, v, PAD, n_new)
  np.testing.assert_array_equal(out.lengths[hit], first[v][hit] + 1)
  np.testing.assert_array_equal(out.lengths[~hit], n_new)
  for i in range(B):
    n = out.lengths[i]
    np.testing.assert_array_equal(out.tokens[i, :n], greedy[i, :n])


def test_generation_independent_of_padding(tiny, eos):
  """The same prompts left-padded more (same key, so the same sampling noise per
  row) sample the same tokens with the same log-probs and masks."""
  gd, params = tiny
  prompts = random_prompts(MIXED, seed=9)
  res = []
  for Tp in (max(MIXED), max(MIXED) + 4):  # up to max_len 24 with 12 new tokens
    t, m = sampling.left_pad(prompts, Tp, PAD)
    res.append(gen(gd, params, t, m, key=5, max_new_tokens=N_NEW, eos_id=eos))
  np.testing.assert_array_equal(res[1].tokens, res[0].tokens)
  np.testing.assert_array_equal(res[1].mask, res[0].mask)
  np.testing.assert_allclose(res[1].logprobs, res[0].logprobs, atol=1e-5)


# ---------------------------------------------------------------------------
# Masks, lengths, EOS, early exit
# ---------------------------------------------------------------------------


def _check_well_formed(out, eos, pad, n_new):
  B = out.tokens.shape[0]
  assert out.tokens.shape == out.mask.shape == out.logprobs.shape == (B, n_new)
  assert out.tokens.dtype == np.int32 and out.mask.dtype == np.float32
  assert out.lengths.shape == (B,)
  for i in range(B):
    row = out.tokens[i].tolist()
    n = row.index(eos) + 1 if eos in row else n_new  # up to and including first EOS
    np.testing.assert_array_equal(out.mask[i], [1.0] * n + [0.0] * (n_new - n))
    assert out.lengths[i] == n == out.mask[i].sum()
    assert all(tok == pad for tok in row[n:])
    assert all(0 <= tok < VOCAB for tok in row)
    assert np.all(out.logprobs[i, n:] == 0.0)


@pytest.mark.parametrize("pad_id", [PAD, "eos"])
def test_mask_and_lengths(tiny, eos, pad_id):
  gd, params = tiny
  toks, mask = mixed_batch(seed=2)
  n_new = N_NEW
  pad = eos if pad_id == "eos" else pad_id
  out = gen(gd, params, toks, mask, key=11, max_new_tokens=n_new, eos_id=eos, pad_id=pad)
  _check_well_formed(out, eos, pad, n_new)
  assert (out.lengths < n_new).any()


def test_early_exit_all_stop_at_once(tiny):
  gd, params = tiny
  prompt = random_prompts([5], seed=4)
  t, m = sampling.left_pad(prompt * len(MIXED), max(MIXED), PAD)
  lg = _fwd(
      gd, params, jnp.asarray(t), scoring.positions_from_mask(jnp.asarray(m)), jnp.asarray(m)
  ).logits
  eos = int(np.argmax(np.asarray(lg[0, -1])))  # the greedy first token
  n_new = N_NEW
  out = gen(gd, params, t, m, max_new_tokens=n_new, eos_id=eos, top_k=1)
  _check_well_formed(out, eos, PAD, n_new)
  np.testing.assert_array_equal(out.tokens[:, 0], eos)
  np.testing.assert_array_equal(out.tokens[:, 1:], PAD)
  np.testing.assert_array_equal(out.lengths, 1)


# ---------------------------------------------------------------------------
# Keys
# ---------------------------------------------------------------------------


def test_deterministic_for_key_and_keys_differ(tiny, eos):
  gd, params = tiny
  toks, mask = mixed_batch(seed=6)
  kw = dict(max_new_tokens=N_NEW, eos_id=eos)
  a = gen(gd, params, toks, mask, key=1, **kw)
  b = gen(gd, params, toks, mask, key=1, **kw)
  c = gen(gd, params, toks, mask, key=2, **kw)
  np.testing.assert_array_equal(a.tokens, b.tokens)
  np.testing.assert_array_equal(a.logprobs, b.logprobs)
  assert (a.tokens[:, 0] != c.tokens[:, 0]).any()
  assert (a.tokens != c.tokens).mean() > 0.2


# ---------------------------------------------------------------------------
# Empirical frequencies == sampling distribution
# ---------------------------------------------------------------------------

N_SAMPLES = 20_000


@pytest.mark.parametrize(
    "temperature,top_k,top_p", [(1.0, 0, 1.0), (0.5, 0, 1.0), (1.0, 3, 1.0), (1.0, 0, 0.6)]
)
def test_first_token_frequencies(tiny, temperature, top_k, top_p):
  gd, params = tiny
  prompt = [3, 7, 1, 12, 5]
  t, m = sampling.left_pad([prompt], len(prompt), PAD)
  logits = np.asarray(
      model.apply(
          gd, params, jnp.asarray(t), scoring.positions_from_mask(jnp.asarray(m)), jnp.asarray(m)
      ).logits[0, -1]
  )
  probs = np_process(logits, temperature, top_k, top_p)  # independent, float64
  proc = np.exp(
      np.asarray(
          scoring.process_logits(
              jnp.asarray(logits), scoring.SamplingSpec(temperature, top_k, top_p)
          ),
          np.float64,
      )
  )
  np.testing.assert_allclose(proc, probs, atol=2e-6)
  support = probs > 0
  if top_k:
    assert support.sum() == top_k
  if top_p < 1.0:
    assert 2 <= support.sum() < VOCAB - 2  # a non-trivial nucleus for this test
    assert probs[support].sum() == pytest.approx(1.0)

  tb, mb = np.repeat(t, N_SAMPLES, 0), np.repeat(m, N_SAMPLES, 0)
  out = gen(
      gd,
      params,
      tb,
      mb,
      key=2024,
      max_new_tokens=1,
      eos_id=3,
      temperature=temperature,
      top_k=top_k,
      top_p=top_p,
  )
  counts = np.bincount(out.tokens[:, 0], minlength=VOCAB)
  n = counts.sum()
  assert n == N_SAMPLES
  # tokens outside the top-k / nucleus never appear
  assert counts[~support].sum() == 0
  freq = counts / n
  # Per-token bound: |freq - p| <= 5 * sqrt(p (1 - p) / n), a 5-sigma binomial
  # deviation (two-sided tail ~5.7e-7 per token, ~1e-5 over the 20 tokens).
  bound = 5.0 * np.sqrt(probs * (1 - probs) / n)
  assert np.all(np.abs(freq - probs) <= bound + 1e-12), (freq, probs)
  # Chi-square goodness of fit on the support, bins with expected count < 5 pooled.
  exp_counts = probs[support] * n
  obs = counts[support]
  small = exp_counts < 5
  if small.any():
    exp_counts = np.append(exp_counts[~small], exp_counts[small].sum())
    obs = np.append(obs[~small], obs[small].sum())
  _, pval = stats.chisquare(obs, exp_counts * obs.sum() / exp_counts.sum())
  assert pval > 1e-3, pval
  # the behaviour log-probs are those of this distribution
  np.testing.assert_allclose(out.logprobs[:, 0], np.log(probs[out.tokens[:, 0]]), atol=1e-4)


# ---------------------------------------------------------------------------
# Bad input
# ---------------------------------------------------------------------------


def test_bad_inputs_raise(tiny, eos):
  gd, params = tiny
  toks, mask = mixed_batch()  # Tp = 8, max_len = 24
  key = jax.random.key(0)
  ok = dict(max_new_tokens=N_NEW, eos_id=eos, pad_id=PAD)

  def bad(match, t=toks, **kw):
    with pytest.raises(ValueError, match=match):
      sampling.generate(gd, params, t, mask, key, **spec_kw({**ok, **kw}))

  bad("max_len", max_new_tokens=17)  # 8 + 17 > 24
  bad("max_new_tokens", max_new_tokens=0)
  bad("max_new_tokens", max_new_tokens=-3)
  bad("top_p", top_p=0.0)
  bad("top_p", top_p=1.5)
  bad("top_p", top_p=-0.2)
  bad("temperature", temperature=0.0)
  bad("temperature", temperature=-1.0)
  bad("top_k", top_k=-1)
  neg = toks.copy()
  neg[0, -1] = -1
  bad("vocabulary", t=neg)
  bad("-1", t=neg)
  big = toks.copy()
  big[2, -1] = VOCAB
  bad("vocabulary", t=big)
  bad(str(VOCAB), t=big)
  # a valid call with the same arguments works (the errors are not spurious)
  gen(gd, params, toks, mask, max_new_tokens=N_NEW, eos_id=eos)
  with pytest.raises(ValueError, match="prompt 1"):
    sampling.left_pad([[1, 2], [1, 2, 3, 4]], 3, PAD)
  t, m = sampling.left_pad([[1, 2], [], [4, 5, 6]], 3, PAD)
  np.testing.assert_array_equal(t, [[PAD, 1, 2], [PAD, PAD, PAD], [4, 5, 6]])
  np.testing.assert_array_equal(m, [[0, 1, 1], [0, 0, 0], [1, 1, 1]])


def test_positions_from_mask():
  m = jnp.array([[0, 0, 1, 1, 1], [1, 1, 1, 1, 1], [0, 0, 0, 0, 1]], bool)
  np.testing.assert_array_equal(
      np.asarray(scoring.positions_from_mask(m))[np.asarray(m)], [0, 1, 2, 0, 1, 2, 3, 4, 0]
  )


# ---------------------------------------------------------------------------
# Special ids, masked positions and empty prompts
# ---------------------------------------------------------------------------


def test_special_ids_validated_and_score_finite(tiny):
  gd, params = tiny
  t, m = sampling.left_pad([[3, 4]], 2, PAD)
  key = jax.random.key(0)
  with pytest.raises(ValueError, match="pad_id"):
    sampling.generate(
        gd, params, t, m, key, max_new_tokens=1, eos_id=3, pad_id=VOCAB, spec=scoring.SamplingSpec()
    )
  with pytest.raises(ValueError, match="eos_id"):
    sampling.generate(
        gd, params, t, m, key, max_new_tokens=1, eos_id=-1, pad_id=PAD, spec=scoring.SamplingSpec()
    )


def test_score_masked_positions_are_zero_whatever_the_token(tiny):
  gd, params = tiny
  t, m = sampling.left_pad([[3, 4, 5]], 3, PAD)
  comp = np.array([[2, VOCAB, VOCAB]], np.int32)
  cmask = np.array([[1.0, 0.0, 0.0]], np.float32)
  sc = _score(gd, params, jnp.asarray(t), jnp.asarray(m), jnp.asarray(comp), jnp.asarray(cmask))
  np.testing.assert_array_equal(np.asarray(sc.logprobs)[0, 1:], 0.0)


def test_empty_prompt_rejected_or_consistent(tiny):
  gd, params = tiny
  t, m = sampling.left_pad([[3, 4, 5], []], 3, PAD)
  try:
    out = gen(gd, params, t, m, max_new_tokens=2, eos_id=1)
  except ValueError:
    return  # rejecting an empty prompt is a fine answer
  sc = _score(
      gd, params, jnp.asarray(t), jnp.asarray(m), jnp.asarray(out.tokens), jnp.asarray(out.mask)
  )
  assert np.abs(np.asarray(sc.logprobs) - out.logprobs).max() <= 1e-4


# ---------------------------------------------------------------------------
# No early stop, length buckets, the jitted entry point, inverse-CDF sampling
# ---------------------------------------------------------------------------


def test_no_eos_runs_every_row_to_the_end_and_matches_score(tiny):
  gd, params = tiny
  toks, mask = mixed_batch(seed=4)
  out = gen(gd, params, toks, mask, key=3, max_new_tokens=N_NEW, eos_id=None)
  B = toks.shape[0]
  np.testing.assert_array_equal(out.mask, np.ones((B, N_NEW), np.float32))
  np.testing.assert_array_equal(out.lengths, N_NEW)
  sc = _score(
      gd,
      params,
      jnp.asarray(toks),
      jnp.asarray(mask),
      jnp.asarray(out.tokens),
      jnp.asarray(out.mask),
  )
  np.testing.assert_allclose(np.asarray(sc.logprobs), out.logprobs, atol=1e-4)
  # the jitted entry point is the same computation without the host checks
  fn = sampling.make_sampler(
      gd, max_new_tokens=N_NEW, eos_id=None, pad_id=PAD, spec=scoring.SamplingSpec()
  )
  direct = jax.tree.map(
      np.asarray, fn(params, jnp.asarray(toks), jnp.asarray(mask), jax.random.key(3))
  )
  np.testing.assert_array_equal(direct.tokens, out.tokens)
  np.testing.assert_array_equal(direct.logprobs, out.logprobs)


@pytest.mark.slow  # ~40 s of CPU each
@pytest.mark.parametrize("eos_id", [None, "eos"])
def test_length_buckets_do_not_change_samples(tiny, eos, eos_id):
  """One bucket (the whole cache every step), three buckets and one bucket
  per step draw the same tokens with the same log-probs."""
  gd, params = tiny
  toks, mask = mixed_batch(seed=8)
  e = eos if eos_id == "eos" else None
  outs = [
      gen(gd, params, toks, mask, key=9, max_new_tokens=N_NEW, eos_id=e, decode_segments=n)
      for n in (1, 3, N_NEW)
  ]
  assert sampling.segment_bounds(N_NEW, 1) == (N_NEW,)
  assert sampling.segment_bounds(N_NEW, N_NEW) == tuple(range(1, N_NEW + 1))
  assert sampling.segment_bounds(N_NEW, 3) == (4, 8, 12)
  for o in outs[1:]:
    np.testing.assert_array_equal(o.tokens, outs[0].tokens)
    np.testing.assert_array_equal(o.mask, outs[0].mask)
    np.testing.assert_allclose(o.logprobs, outs[0].logprobs, atol=1e-5)
  if e is not None:
    assert (outs[0].lengths < N_NEW).any()


def test_segment_bounds_cover_the_steps():
  for n in (1, 5, 8, 12, 48, 49, 1000):
    for segs in (0, 1, 3, 7):
      b = sampling.segment_bounds(n, segs)
      assert b[-1] == n and list(b) == sorted(set(b)) and b[0] >= 1
      assert len(b) <= max(segs, 4)
  for bad in (-1, 1.5, True, "2"):
    with pytest.raises(ValueError, match="decode_segments"):
      sampling.segment_bounds(12, bad)


def test_tokens_from_uniform_is_the_inverse_cdf():
  """Against numpy float64: token = first index whose CDF exceeds u, on a grid
  of u; masked (zero-probability) tokens are never returned, even at u -> 1."""
  rng = np.random.default_rng(0)
  logits = rng.normal(size=(3, VOCAB)).astype(np.float32)
  logits[1, -5:] = -1e30  # masked tail: u near 1 must not land there
  logits[2, :4] = -1e30  # masked head: u = 0 must not land there
  logp = np.asarray(jax.nn.log_softmax(jnp.asarray(logits), -1))
  u = np.concatenate(
      [np.linspace(0, 1, 2001, endpoint=False), [np.nextafter(np.float32(1), np.float32(0))]]
  ).astype(np.float32)
  got = np.asarray(
      sampling.tokens_from_uniform(
          jnp.asarray(np.repeat(u[None, :, None], 3, 0)), jnp.asarray(logp)[:, None, :]
      )
  )
  p64 = np.exp(logp.astype(np.float64))
  cdf = np.cumsum(p64 / p64.sum(-1, keepdims=True), -1)
  for r in range(3):
    want = np.minimum(
        np.searchsorted(cdf[r], u.astype(np.float64), side="right"),
        np.flatnonzero(p64[r] > 0).max(),
    )
    # float32 vs float64 CDFs can differ right at a boundary: allow a few grid points
    assert (got[r] != want).sum() <= 3, np.flatnonzero(got[r] != want)
    assert np.all(p64[r][got[r]] > 0)
  assert got[1, -1] == VOCAB - 6 and got[2, 0] == 4


def test_a_graphdef_passed_again_is_not_hashed_and_an_equal_one_shares_the_sampler(
    tiny, monkeypatch
):
  """``generate`` looks its model config and jitted sampler up by the
  graphdef object (hashing an NNX graphdef walks the module tree; a trainer
  passes the same object every round); a graphdef equal to it but built
  anew (a model rebuilt) still gets the same jitted sampler, compiled once."""
  gd, params = tiny
  toks, mask = mixed_batch(seed=2)
  kw = dict(max_new_tokens=3, eos_id=None, pad_id=PAD, spec=scoring.SamplingSpec())
  first = sampling.generate(gd, params, toks, mask, jax.random.key(0), **kw)
  calls = []
  real_hash = type(gd).__hash__
  monkeypatch.setattr(type(gd), "__hash__", lambda self: calls.append(1) or real_hash(self))
  again = sampling.generate(gd, params, toks, mask, jax.random.key(0), **kw)
  assert not calls  # neither cache hashed the graphdef
  np.testing.assert_array_equal(again.tokens, first.tokens)
  fn = sampling.make_sampler(gd, **kw)
  gd2, _ = model.build(tiny_config(), seed=1)
  assert gd2 is not gd and gd2 == gd
  assert sampling.make_sampler(gd2, **kw) is fn  # found by equality: one jit, one compile
  assert calls  # ... which took a hash
