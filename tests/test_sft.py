"""The committed SFT config: loss falls and the base lands in the pass-rate band."""

import os

import pytest

from cbs_jax import metrics as metrics_lib
from cbs_jax import train
from configs import sft_arithmetic


@pytest.mark.slow
def test_committed_sft_config_lands_in_the_band(tmp_path):
  c = sft_arithmetic.get_config()
  c.train.progress = False
  summary = train.train_and_evaluate(c, str(tmp_path))
  rows = metrics_lib.read_jsonl(os.path.join(tmp_path, "metrics.jsonl"))
  losses = [r["loss"] for r in rows]
  assert rows[0]["step"] == 1 and rows[-1]["step"] == c.sft.steps
  assert losses[-1] < 0.5 * losses[0], losses  # from ~log(vocab) to well below
  assert 0.2 <= summary["base_pass_rate"] <= 0.6, summary
