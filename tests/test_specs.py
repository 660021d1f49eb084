"""Tests for the frozen settings ``rl.RLSpec`` and ``scoring.SamplingSpec``.

``INVALID`` lists, for every field of ``config.rl`` and ``config.sampling``
that ``config.validate`` range-checked before the specs existed, bad values
with the exact message that validate gave for them then (recorded from that
code). Both ``config.validate`` and the spec's constructor must reject each
with that message: the checks live in one place and moved unchanged.
"""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from cbs_jax import config as config_lib
from cbs_jax import rl
from cbs_jax import sampling
from cbs_jax import scoring

nan = float("nan")

INVALID = [
    ("rl.algo", "nope", "config.rl.algo='nope' is not one of ['grpo', 'ppo']"),
    ("rl.algo", None, "config.rl.algo=None is not one of ['grpo', 'ppo']"),
    (
        "rl.advantage",
        "nope",
        "config.rl.advantage='nope' is not one of "
        "['grpo', 'drgrpo', 'rloo', 'batch_std', 'gae']",
    ),
    ("rl.loss", "ppo2", "config.rl.loss='ppo2' is not one of ['ppo', 'cispo', 'pg', 'gspo']"),
    (
        "rl.aggregation",
        "mean",
        "config.rl.aggregation='mean' is not one of "
        "['token_mean', 'seq_mean_token_mean', 'seq_mean_token_sum_norm']",
    ),
    ("rl.kl_estimator", "k4", "config.rl.kl_estimator='k4' is not one of ['k1', 'k2', 'k3']"),
    ("rl.adv_std_ddof", 2, "config.rl.adv_std_ddof=2 is not one of [0, 1]"),
    ("rl.adv_std_ddof", -1, "config.rl.adv_std_ddof=-1 is not one of [0, 1]"),
    ("rl.kl_beta", -0.1, "config.rl.kl_beta must be >= 0, got -0.1"),
    ("rl.kl_beta", nan, "config.rl.kl_beta must be >= 0, got nan"),
    ("rl.kl_beta", None, "config.rl.kl_beta must be a number, got None"),
    ("rl.vf_coef", -1.0, "config.rl.vf_coef must be >= 0, got -1.0"),
    ("rl.vf_coef", None, "config.rl.vf_coef must be a number, got None"),
    ("rl.value_clip", -0.5, "config.rl.value_clip must be >= 0, got -0.5"),
    ("rl.value_clip", None, "config.rl.value_clip must be a number, got None"),
    ("rl.clip_c", -1.0, "config.rl.clip_c must be >= 0, got -1.0"),
    ("rl.clip_c", 0.5, "config.rl.clip_c must be > 1 when set (0 = off), got 0.5"),
    ("rl.clip_c", 1.0, "config.rl.clip_c must be > 1 when set (0 = off), got 1.0"),
    ("rl.clip_c", None, "config.rl.clip_c must be a number, got None"),
    ("rl.clip_eps_low", 0.0, "config.rl.clip_eps_low must be > 0, got 0.0"),
    ("rl.clip_eps_low", -0.1, "config.rl.clip_eps_low must be > 0, got -0.1"),
    ("rl.clip_eps_low", nan, "config.rl.clip_eps_low must be > 0, got nan"),
    ("rl.clip_eps_low", None, "config.rl.clip_eps_low must be a number, got None"),
    ("rl.clip_eps_high", 0.0, "config.rl.clip_eps_high must be > 0, got 0.0"),
    ("rl.clip_eps_high", -2.0, "config.rl.clip_eps_high must be > 0, got -2.0"),
    ("rl.clip_eps_high", None, "config.rl.clip_eps_high must be a number, got None"),
    ("rl.adv_eps", 0.0, "config.rl.adv_eps must be > 0, got 0.0"),
    ("rl.adv_eps", -1e-06, "config.rl.adv_eps must be > 0, got -1e-06"),
    ("rl.adv_eps", None, "config.rl.adv_eps must be a number, got None"),
    ("rl.gamma", 1.5, "config.rl.gamma must be in [0, 1], got 1.5"),
    ("rl.gamma", -0.1, "config.rl.gamma must be in [0, 1], got -0.1"),
    ("rl.gamma", nan, "config.rl.gamma must be in [0, 1], got nan"),
    ("rl.gamma", None, "config.rl.gamma must be a number, got None"),
    ("rl.lam", 1.01, "config.rl.lam must be in [0, 1], got 1.01"),
    ("rl.lam", -0.5, "config.rl.lam must be in [0, 1], got -0.5"),
    ("rl.lam", None, "config.rl.lam must be a number, got None"),
    ("sampling.top_k", -1, "config.sampling.top_k must be >= 0, got -1"),
    ("sampling.top_k", None, "config.sampling.top_k must be a number, got None"),
    ("sampling.temperature", 0.0, "config.sampling.temperature must be > 0, got 0.0"),
    ("sampling.temperature", -1.0, "config.sampling.temperature must be > 0, got -1.0"),
    ("sampling.temperature", nan, "config.sampling.temperature must be > 0, got nan"),
    ("sampling.temperature", None, "config.sampling.temperature must be a number, got None"),
    ("sampling.top_p", 0.0, "config.sampling.top_p must be in (0, 1], got 0.0"),
    ("sampling.top_p", 1.5, "config.sampling.top_p must be in (0, 1], got 1.5"),
    ("sampling.top_p", -0.2, "config.sampling.top_p must be in (0, 1], got -0.2"),
    ("sampling.top_p", nan, "config.sampling.top_p must be in (0, 1], got nan"),
    ("sampling.top_p", None, "config.sampling.top_p must be a number, got None"),
]
SPECS = {"rl": rl.RLSpec, "sampling": scoring.SamplingSpec}


@pytest.mark.parametrize("field,value,message", INVALID, ids=lambda x: repr(x)[:40])
def test_validate_and_spec_reject_with_the_same_message(field, value, message):
  section, name = field.split(".")
  c = config_lib.base_config()
  c[section][name] = value
  with pytest.raises(ValueError) as from_validate:
    config_lib.validate(c)
  with pytest.raises(ValueError) as from_spec:
    SPECS[section](**{name: value})
  assert str(from_validate.value) == message
  assert str(from_spec.value) == message


def test_every_spec_field_is_a_config_field_with_its_default():
  base = config_lib.base_config()
  for section, cls in SPECS.items():
    fields = {f.name for f in dataclasses.fields(cls)}
    assert fields - {"suppress_ids"} <= set(base[section]), section
  assert {f.name for f in dataclasses.fields(rl.RLSpec)} == set(base.rl)
  default = rl.RLSpec()
  for f in dataclasses.fields(rl.RLSpec):
    assert getattr(default, f.name) == base.rl[f.name], f.name
  assert rl.RLSpec.from_config(base.rl) == default
  assert scoring.SamplingSpec.from_config(base.sampling) == scoring.SamplingSpec()
  config_lib.validate(base)


def test_from_config_reads_every_field():
  c = config_lib.base_config()
  over = dict(
      algo="ppo",
      advantage="gae",
      adv_eps=1e-3,
      adv_std_ddof=1,
      adv_whiten=False,
      loss="cispo",
      clip_eps_low=0.3,
      clip_eps_high=0.28,
      clip_c=3.0,
      aggregation="seq_mean_token_sum_norm",
      kl_beta=0.04,
      kl_estimator="k2",
      gamma=0.99,
      lam=0.9,
      vf_coef=0.25,
      value_clip=0.2,
  )
  assert set(over) == set(c.rl)
  for k, v in over.items():
    c.rl[k] = v
  assert dataclasses.asdict(rl.RLSpec.from_config(c.rl)) == over
  c.sampling.temperature, c.sampling.top_k, c.sampling.top_p = 0.7, 5, 0.9
  spec = scoring.SamplingSpec.from_config(c.sampling, suppress_ids=[0, 1])
  assert spec == scoring.SamplingSpec(0.7, 5, 0.9, (0, 1))


def test_specs_are_frozen_hashable_and_normalised():
  a = scoring.SamplingSpec(1, np.int64(3), 1, [2, np.int32(0)])
  b = scoring.SamplingSpec(1.0, 3, 1.0, (2, 0))
  assert a == b and hash(a) == hash(b)
  assert type(a.temperature) is float and type(a.top_k) is int and a.suppress_ids == (2, 0)
  assert all(type(i) is int for i in a.suppress_ids)
  r = rl.RLSpec(clip_c=3, gamma=1, adv_std_ddof=1)
  assert r == rl.RLSpec(clip_c=3.0, gamma=1.0, adv_std_ddof=1) and hash(r) == hash(
      rl.RLSpec(clip_c=3.0, gamma=1.0, adv_std_ddof=1)
  )
  assert type(r.clip_c) is float and type(r.gamma) is float
  with pytest.raises(dataclasses.FrozenInstanceError):
    b.temperature = 2.0
  with pytest.raises(dataclasses.FrozenInstanceError):
    r.kl_beta = 0.1


def test_checks_that_config_validate_never_needed():
  """Values a type-locked ConfigDict cannot normally hold, or fields that are
  not config fields: rejected by the specs (and so by validate)."""
  with pytest.raises(ValueError, match=r"config\.sampling\.top_k must be an integer"):
    scoring.SamplingSpec(top_k=1.5)
  for bad in ((-1,), ("a",), (True,), 3):
    with pytest.raises(ValueError, match="suppress_ids must be token ids"):
      scoring.SamplingSpec(suppress_ids=bad)
  with pytest.raises(ValueError, match=r"config\.rl\.adv_whiten must be True or False"):
    rl.RLSpec(adv_whiten=None)
  c = config_lib.base_config()
  c.rl.adv_whiten = None
  with pytest.raises(ValueError, match=r"config\.rl\.adv_whiten"):
    config_lib.validate(c)
  with pytest.raises(TypeError, match="SamplingSpec"):
    sampling.check_sampling_args(4, dict(temperature=1.0))


def test_cross_section_checks_stay_in_validate():
  """PPO <-> GAE and PPO's value head involve other fields: the spec alone
  accepts them, validate rejects the inconsistent config."""
  rl.RLSpec(algo="ppo")  # advantage "grpo": a valid spec
  c = config_lib.base_config()
  c.rl.algo = "ppo"
  c.model.value_head = True
  with pytest.raises(ValueError, match=r"config\.rl\.advantage='grpo' with config\.rl\.algo"):
    config_lib.validate(c)
  c.rl.advantage, c.model.value_head = "gae", False
  with pytest.raises(ValueError, match=r"config\.model\.value_head"):
    config_lib.validate(c)


def test_process_logits_under_a_static_spec_against_numpy():
  """The spec as a static jit argument: equal specs share one compile, and the
  processed distribution is softmax(x / T) over the ids not suppressed."""
  traces = []
  fn = jax.jit(
      lambda x, spec: (traces.append(spec), scoring.process_logits(x, spec))[1], static_argnums=1
  )
  x = np.random.default_rng(0).normal(size=(3, 7)).astype(np.float32) * 2
  for spec in (scoring.SamplingSpec(0.5, 0, 1.0, (0, 4)), scoring.SamplingSpec(0.5, 0, 1, [0, 4])):
    p = np.exp(np.asarray(fn(jnp.asarray(x), spec), np.float64))
    z = x.astype(np.float64) / 0.5
    z[:, [0, 4]] = -np.inf
    want = np.exp(z - z.max(-1, keepdims=True))
    want /= want.sum(-1, keepdims=True)
    np.testing.assert_allclose(p, want, atol=1e-6)
  assert len(traces) == 1
