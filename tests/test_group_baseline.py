"""The K-dependence of the noise traces under a group-mean baseline
(``cbs_jax.group_baseline``, docs/noise.md) against a Monte Carlo of
per-rollout policy gradients with group-centred advantages, on a softmax
policy with shared parameters whose exact moments are enumerated."""

import os

import numpy as np
import pytest

from cbs_jax import group_baseline

M, D, PROMPTS = 6, 4, 40  # outcomes, prompt features, prompts


def _toy(seed=0):
  """A softmax policy logits = W x_p over M outcomes (W shared), binary
  rewards R_p(y); returns per-prompt probabilities, rewards, scores s(y)
  = d log pi(y) / dW (flattened), and the exact moments (q, f, h, v, G)."""
  rng = np.random.default_rng(seed)
  W = rng.normal(0, 0.7, (M, D))
  x = rng.normal(0, 1, (PROMPTS, D))
  R = (rng.uniform(size=(PROMPTS, M)) < 0.4).astype(float)
  logits = x @ W.T
  pi = np.exp(logits - logits.max(1, keepdims=True))
  pi /= pi.sum(1, keepdims=True)
  eye = np.eye(M)
  s = (eye[None, :, :] - pi[:, None, :])[..., None] * x[:, None, None, :]  # [P, y, M, D]
  s = s.reshape(PROMPTS, M, M * D)
  m = (pi * R).sum(1)
  u = R - m[:, None]
  a = np.einsum("py,py,pyd->pd", pi, u, s)
  sq = (s**2).sum(-1)
  q = np.mean((pi * u**2 * sq).sum(1))
  f = np.mean((pi * u**2).sum(1) * (pi * sq).sum(1))
  G = a.mean(0)
  h = np.mean((a**2).sum(1))
  v = np.mean(((a - G) ** 2).sum(1))
  return pi, R, s, dict(q=q, f=f, h=h, v=v), G


@pytest.mark.parametrize("K", [2, 4, 16])
def test_traces_match_a_monte_carlo_of_group_centred_gradients(K):
  pi, R, s, mom, G = _toy()
  rng = np.random.default_rng(K)
  groups = 60_000
  p = rng.integers(0, PROMPTS, groups)
  cum = np.cumsum(pi[p], 1)
  y = (rng.uniform(size=(groups, K, 1)) > cum[:, None, :]).sum(-1)  # [groups, K]
  r = R[p[:, None], y]
  adv = r - r.mean(1, keepdims=True)
  g = adv[..., None] * s[p[:, None], y]  # [groups, K, M*D]
  gbar = g.mean(1)
  # within-group sample variance: unbiased for tr E_p (C_p - D_p) = tr Sigma_intra
  intra = np.mean(((g - gbar[:, None]) ** 2).sum(-1).sum(1) / (K - 1))
  # prompt means: tr Cov(gbar) = tr Sigma_inter + tr Sigma_intra / K
  total = np.mean(((gbar - gbar.mean(0)) ** 2).sum(-1))
  inter = total - intra / K
  want = group_baseline.traces(**mom, K=K)
  assert intra == pytest.approx(want["trace_intra"], rel=0.03)
  assert inter == pytest.approx(want["trace_inter"], rel=0.08)
  # the gradient itself shrinks by (K - 1) / K
  assert np.linalg.norm(gbar.mean(0) - (K - 1) / K * G) < 0.05 * np.linalg.norm(G)
  assert want["g2_ratio"] == ((K - 1) / K) ** 2


def test_the_baseline_terms_vanish_at_large_K():
  _, _, _, mom, G = _toy(1)
  far = group_baseline.traces(**mom, K=1e6)
  assert far["trace_intra"] == pytest.approx(mom["q"] - mom["h"], rel=1e-4)
  assert far["trace_inter"] == pytest.approx(mom["v"], rel=1e-4)
  assert mom["h"] == pytest.approx(float(G @ G) + mom["v"])


def test_fit_recovers_moments_and_flags_a_misfit():
  mom = dict(q=50.0, f=30.0, h=4.0, v=1.5)
  Ks = [4, 16, 64]
  tr = [group_baseline.traces(**mom, K=K) for K in Ks]
  ti, tb = [t["trace_intra"] for t in tr], [t["trace_inter"] for t in tr]
  fit = group_baseline.fit_moments(Ks, ti, tb, [0.5] * 3, [0.1] * 3)
  for k, val in mom.items():
    assert fit["moments"][k] == pytest.approx(val, rel=1e-8)
  assert fit["dof"] == 2 and fit["chi2"] < 1e-12 and fit["p_value"] > 0.99
  # inter-prompt traces rising with K are not of this form: a clear misfit
  bad = group_baseline.fit_moments(Ks, ti, [1.0, 2.0, 3.0], [0.5] * 3, [0.05] * 3)
  assert bad["p_value"] < 1e-3
  with pytest.raises(ValueError, match="K=1"):
    group_baseline.coefficients(1)


def test_k_dependence_reads_the_committed_traces_and_writes_its_verdicts(tmp_path, capsys):
  from tests import experiment_scripts  # pylint: disable=import-outside-toplevel

  experiment_scripts.load("k_dependence").main([f"--out={tmp_path}"])
  text = (tmp_path / "k_dependence.md").read_text()
  rows = [l for l in text.splitlines() if l.startswith("| SFT base |") or l.startswith("| end |")]
  assert len(rows) == 2 and all(("fits" in r) or ("misfits" in r) for r in rows)
  assert "lack-of-fit p" in text and "Command: `python experiments/k_dependence.py" in text
  # the committed verdicts are what the committed measurements give (the command line aside)
  committed = os.path.join(
      os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
      "experiments",
      "results",
      "noise_anatomy",
  )
  with open(os.path.join(committed, "k_dependence.json"), "rb") as f:
    assert (tmp_path / "k_dependence.json").read_bytes() == f.read()
  with open(os.path.join(committed, "k_dependence.md")) as f:
    want = [l for l in f.read().splitlines() if not l.startswith("Command:")]
  assert [l for l in text.splitlines() if not l.startswith("Command:")] == want
