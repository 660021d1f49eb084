"""The exact expected pass rate against Monte-Carlo sampling of the policy.

Independent check: the exact value sums teacher-forced probabilities of the
enumerated accepted completions; the sampled value runs the real sampler
(``rollouts.rollout``, the same path training uses) >= 20k times and the
verifier on what it wrote. They must agree within 4 binomial SEs.
"""

import jax
import numpy as np
import pytest

from cbs_jax import config as config_lib
from cbs_jax import evaluation
from cbs_jax import rollouts
from cbs_jax import run_setup
from cbs_jax import scoring
from cbs_jax import train


def _policy(tmp_path, task, kwargs, steps):
  c = config_lib.base_config()
  c.task.name = task
  with c.task.unlocked():
    c.task.kwargs = config_lib.ConfigDict(kwargs)
  c.model.d_model, c.model.d_ff, c.model.num_layers = 32, 64, 1
  c.sft.steps, c.sft.batch_size, c.sft.eval_every, c.sft.lr = steps, 64, 0, 1e-2
  c.sft.label_noise = 0.3
  c.train.eval_prompts, c.train.progress = 48, False
  setup = run_setup.prepare(c)
  graphdef, params, _ = train.sft_base(c, str(tmp_path), setup)
  return c, setup, graphdef, params


@pytest.mark.slow  # two SFT runs of 300 steps
@pytest.mark.parametrize(
    "task,kwargs,steps",
    [
        ("arithmetic", dict(min_digits=1, max_digits=1, ops="+-"), 300),
        ("countdown", dict(num_numbers=2, max_number=9, ops="+-*"), 300),
    ],
)
def test_expected_pass_matches_sampled_pass(tmp_path, task, kwargs, steps):
  c, setup, graphdef, params = _policy(tmp_path, task, kwargs, steps)
  assert setup.expected is not None
  per_problem = setup.expected.per_problem(graphdef, params)
  exact = setup.expected(graphdef, params)
  assert exact["expected_pass"] == pytest.approx(per_problem.mean())
  K = 448  # 48 prompts x 448 = 21,504 samples
  out = rollouts.rollout(
      graphdef,
      params,
      setup.task,
      setup.tok,
      setup.eval_problems,
      K,
      jax.random.key(7),
      setup.layout,
      setup.eval_sampling,
  )
  sampled = out["rewards"]  # [P, K]
  n = sampled.size
  se = np.sqrt(np.sum(K * per_problem * (1 - per_problem))) / n
  assert 0.05 < per_problem.mean() < 0.95, per_problem.mean()  # a non-trivial policy
  z = (sampled.mean() - per_problem.mean()) / se
  assert abs(z) < 4, (sampled.mean(), per_problem.mean(), se)
  # per problem, too: the worst of 48 problems within 4.5 SEs
  se_p = np.sqrt(np.maximum(per_problem * (1 - per_problem), 1e-12) / K)
  zp = (sampled.mean(1) - per_problem) / np.maximum(se_p, 1.0 / K)
  assert np.max(np.abs(zp)) < 4.5, zp
  # by difficulty: the same weighting as the overall mean
  diff = np.array([p.difficulty for p in setup.eval_problems])
  for d, v in exact["by_difficulty"].items():
    assert v == pytest.approx(per_problem[diff == d].mean())


def test_task_without_enumerable_answers_is_a_clear_error():
  c = config_lib.base_config()
  c.task.name = "gsm8k"
  with c.task.unlocked():
    c.task.kwargs = config_lib.ConfigDict()
  from cbs_jax import tasks  # pylint: disable=import-outside-toplevel

  task = tasks.make_task("gsm8k")
  tok = tasks.make_tokenizer(task)
  layout = rollouts.Layout.for_task(task)
  with pytest.raises(ValueError, match="'gsm8k'.*sampled pass rate"):
    evaluation.ExpectedPass(task, tok, task.problems[:2], layout, scoring.SamplingSpec())
  # the trainer falls back to the sampled pass rate (documented in config.py)
  c.model.max_len = 1024
  setup = run_setup.prepare(c)
  assert setup.expected is None
