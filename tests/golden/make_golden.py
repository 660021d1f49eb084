"""Writes (or checks) the golden metrics rows that pin the trainer's numerics.

Each case is a config and a number of rounds; the rows the run logs, minus
the wall-clock fields, are stored as JSON in this folder. The stored files
were written at the commit before the typed-state refactor (see the file's
``commit`` field), so ``tests/test_golden.py`` checks that every logged number
still equals them on the same kind of processor: bit for bit through the
refactor, to rounding since (its module doc says how close and why).

Why per processor: XLA compiles for the host's instruction set (AVX2 or
AVX-512 vector widths change the order of float sums), and a run's small
differences grow over training. The same seed on an AVX-512 box and on
the same box limited to AVX2 (XLA_FLAGS=--xla_cpu_max_isa=AVX2) gives base
expected pass rates 0.1444 vs 0.1417 in the quickstart case. So a file
``<case>@<fingerprint>.json`` holds the rows of one processor kind
(``fingerprint``: the instruction-set flags XLA can target and the jaxlib
version); ``<case>.json`` without one was written before fingerprints were
recorded, on a processor not known now.

The fingerprint does not decide every bit: ``adaptive_offpolicy@1dcbe47ce3``
was written on one machine of that fingerprint, and on another machine of the
same fingerprint both its writer (f070fc1) and later code log 5 noise fields
that differ from it at 1e-7 (relative) and match the ``@195e09cf09`` rows bit
for bit. So a run passes when it equals any stored fixture: all were written
by the pre-refactor code.

    python tests/golden/make_golden.py            # write every case for this processor
    python tests/golden/make_golden.py quickstart # one case

To record a new processor kind at the pre-refactor commit, run the cases
with that commit's code: ``git worktree add /tmp/f070 f070fc1`` and
``python tests/golden/make_golden.py --code=/tmp/f070``.
"""

import glob
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
  # the controller as it was when the fixture was written: aim at N = the
  # signal, no lr ramp or second-moment rescaling on a switch
  # (fields the pre-refactor code does not have are set only where they exist)
  for field, value in (
      ("adaptive_objective", "steps"),
      ("adaptive_switch_warmup", 0),
      ("adaptive_rescale_nu", False),
      ("adaptive_rescale_mu", False),
  ):
    if field in c.batch:
      c.batch[field] = value
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


def processor() -> dict:
  from cbs_jax import report  # pylint: disable=import-outside-toplevel

  return report.processor()


def fingerprint(proc: dict | None = None) -> str:
  from cbs_jax import report  # pylint: disable=import-outside-toplevel

  return report.processor_fingerprint(proc)


def path(name: str, fp: str | None = None) -> str:
  """The fixture of case ``name`` for processor fingerprint ``fp`` (None:
  the one written before fingerprints were recorded)."""
  return os.path.join(HERE, f"{name}.json" if fp is None else f"{name}@{fp}.json")


def fixtures(name: str) -> dict:
  """{fingerprint or None: the stored file's content} of case ``name``."""
  out = {}
  for p in sorted(glob.glob(os.path.join(HERE, f"{name}*.json"))):
    stem = os.path.basename(p)[: -len(".json")]
    case, _, fp = stem.partition("@")
    if case == name:
      with open(p) as f:
        out[fp or None] = json.load(f)
  return out


def _rows_with(code: str, name: str, workdir: str) -> list[dict]:
  """``run_case`` in a child process that imports cbs_jax from ``code`` (a
  checkout of another commit)."""
  prog = (
      f"import json, sys; sys.path.insert(0, {code!r}); sys.path.insert(1, {HERE!r}); "
      f"import make_golden; print(json.dumps(make_golden.run_case({name!r}, {workdir!r})))"
  )
  out = subprocess.run(
      [sys.executable, "-c", prog], capture_output=True, text=True, check=True, cwd=code
  ).stdout
  return json.loads(out.strip().splitlines()[-1])


def main(argv):
  """``make_golden.py [--code=DIR] [case ...]``: write the cases for this
  processor, running the code of checkout DIR (default: this tree)."""
  code = next((a.split("=", 1)[1] for a in argv if a.startswith("--code=")), None)
  names = [a for a in argv if not a.startswith("--")]
  src = code or ROOT
  commit = subprocess.run(
      ["git", "rev-parse", "HEAD"], cwd=src, capture_output=True, text=True
  ).stdout.strip()
  proc = processor()
  fp = fingerprint(proc)
  for name in names or CASES:
    with tempfile.TemporaryDirectory() as d:
      rows = _rows_with(code, name, d) if code else run_case(name, d)
    with open(path(name, fp), "w") as f:
      json.dump({"case": name, "commit": commit, "processor": proc, "rows": rows}, f, indent=1)
    print(f"wrote {path(name, fp)}: {len(rows)} rows")


if __name__ == "__main__":
  main(sys.argv[1:])
