"""Writes (or checks) the golden metrics rows that pin the trainer's numerics.

Each case is a config and a number of rounds; the rows the run logs, minus
the wall-clock fields, are stored as JSON in this folder. The stored files
were written at the commit before the typed-state refactor (see the file's
``commit`` field), so ``tests/test_golden.py`` checks that the refactor left
every logged number bit-identical on the same machine.

    python tests/golden/make_golden.py            # write every case
    python tests/golden/make_golden.py quickstart # one case
"""

import json
import os
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, ROOT)

# fields that measure time, not numerics
TIMING = (
    "gen_seconds",
    "update_seconds",
    "tokens_per_s",
    "eval_expected_seconds",
    "eval_sampled_seconds",
)


def quickstart():
  """configs/default.py (the README's quickstart), 20 rounds, with a shorter
  SFT (1,000 steps: the RL loop is what is pinned) and evaluations every 10."""
  from configs import default  # pylint: disable=import-outside-toplevel

  c = default.get_config()
  c.sft.steps = 1000
  c.sft.eval_every = 0
  c.train.num_rounds = 20
  c.train.eval_every = 10
  c.train.eval_prompts = 64
  c.train.progress = False
  return c


def adaptive_offpolicy():
  """Every path the refactor touches at smoke size: the adaptive controller
  (b_noise signal), two minibatches x two epochs, staleness 1, exact noise
  by ghost norms, per-update drift and the held-out drift probe."""
  from configs import default  # pylint: disable=import-outside-toplevel

  c = default.get_config("smoke")
  c.sft.steps, c.sft.batch_size = 1000, 128  # a base with rewards to learn from
  c.train.num_rounds = 12
  c.train.eval_every = 6
  c.batch.schedule = "adaptive"
  c.batch.adaptive_signal = "b_noise"
  c.batch.num_prompts = 8
  c.batch.adaptive_min_prompts = 8
  c.batch.adaptive_max_prompts = 32
  c.batch.adaptive_every = 3
  c.batch.num_minibatches = 2
  c.batch.num_epochs = 2
  c.batch.staleness = 1
  c.noise.split_every = 1
  c.noise.exact_every = 2
  c.noise.exact_method = "ghost"
  c.noise.chunk_prompts = 2
  c.noise.drift_every = 3
  c.drift.probe_prompts = 4
  return c


def ppo_kl():
  """PPO with a value head, GAE and a KL penalty to the SFT base, smoke size."""
  from configs import arithmetic_ppo  # pylint: disable=import-outside-toplevel

  c = arithmetic_ppo.get_config("smoke")
  c.rl.kl_beta = 0.1
  c.train.num_rounds = 6
  return c


CASES = {"quickstart": quickstart, "adaptive_offpolicy": adaptive_offpolicy, "ppo_kl": ppo_kl}


def clean(row: dict) -> dict:
  return {k: v for k, v in row.items() if k not in TIMING}


def run_case(name: str, workdir: str) -> list[dict]:
  from cbs_jax import metrics as metrics_lib  # pylint: disable=import-outside-toplevel
  from cbs_jax import train  # pylint: disable=import-outside-toplevel

  train.train_and_evaluate(CASES[name](), workdir)
  rows = metrics_lib.read_jsonl(os.path.join(workdir, "metrics.jsonl"))
  return [clean(r) for r in rows]


def path(name: str) -> str:
  return os.path.join(HERE, f"{name}.json")


def main(names):
  commit = subprocess.run(
      ["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True
  ).stdout.strip()
  for name in names or CASES:
    with tempfile.TemporaryDirectory() as d:
      rows = run_case(name, d)
    with open(path(name), "w") as f:
      json.dump({"case": name, "commit": commit, "rows": rows}, f, indent=1)
    print(f"wrote {path(name)}: {len(rows)} rows")


if __name__ == "__main__":
  main(sys.argv[1:])
