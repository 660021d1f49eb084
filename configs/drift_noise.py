"""Off-policy reuse: gradient noise against policy drift, and the clipping ablation.

    python experiments/drift_noise.py            # reuse 2/4/8/16 x {unclipped, clip 0.2}
    python experiments/clipping_ablation.py      # five clipping schemes x 3 seeds

One generation round of N = 1,024 rollouts (P = 64 prompts x K = 16) from
the default SFT base is split into m prompt minibatches, one epoch: m
optimizer updates per round, update j on minibatch j, which the parameters
have not been fitted to. Drift kappa = KL(behaviour || current) is measured
exactly (full vocabulary) on probe rollouts that no update uses
(``drift.probe_prompts``); the exact per-rollout noise (tr Sigma_intra,
tr Sigma_inter, |G|^2) at every update on that update's minibatch
(``noise.drift_every``).

``get_config(arg)``:
  pg<m>        plain importance-weighted policy gradient (no clipping), m updates
  clip<m>      PPO clip 0.2, m updates          (m in 2, 4, 8, 16)
  clip0.2      PPO clip 0.2                      }
  clip10       symmetric clip 10 (= none)        }  the clipping ablation,
  asym         0.2 / 0.28 (clip-higher)          }  m = 8 updates per round
  cispo        CISPO, IS weight clipped at 1.28  }
  dualclip     PPO 0.2 with dual clip c = 3      }
  quick        a tiny pg4 for the test suite

At the published drift (``drift_regime.py`` found which reuse reaches it:
kappa ~ 0.05 at 4 epochs, ~ 0.13 at 8, at the on-policy learning rate):
  e<E>x<L>     pg8 over E epochs of the round, learning rate x L, the exact
               noise at every update (the drift study's regime design)
  <scheme>@e<E>  a clipping scheme above over E epochs (8 updates each),
               run long enough to plateau (the clipping study at that drift)
"""

import re

from configs import default

REUSE = (2, 4, 8, 16)
CLIP_VARIANTS = ("clip0.2", "clip10", "asym", "cispo", "dualclip")
ABLATION_UPDATES = 8
SEEDS = (0, 1, 2)
ROUNDS = 60  # drift_noise runs (one seed)
ABLATION_ROUNDS = 80  # clipping ablation runs
REGIME_ROUNDS = 30  # e<E>x<L> runs
PLATEAU_ROUNDS = 200  # <scheme>@e<E> runs: long enough for every seed to plateau
PLATEAU_EVAL_EVERY = 5  # their held-out evaluations (the plateau test reads these)


def get_config(arg="clip8"):
  regime = re.fullmatch(r"e(\d+)x(\d+)", arg)
  if regime:
    E, L = int(regime.group(1)), int(regime.group(2))
    if E < 1 or L < 1:
      raise ValueError(f"drift_noise variant {arg!r}: epochs and rate scale must be >= 1")
    c = get_config("pg8")
    c.batch.num_epochs = E
    c.optim.lr *= L
    c.train.num_rounds = REGIME_ROUNDS
    c.train.eval_every = c.train.checkpoint_every = 10
    return c
  scheme, at, epochs = arg.partition("@e")
  if at:
    if scheme not in CLIP_VARIANTS or not epochs.isdigit() or int(epochs) < 1:
      raise ValueError(
          f"drift_noise variant {arg!r}: want <scheme>@e<epochs>, scheme in {CLIP_VARIANTS}"
      )
    c = get_config(scheme)
    c.batch.num_epochs = int(epochs)
    c.train.num_rounds = PLATEAU_ROUNDS
    c.train.eval_every = PLATEAU_EVAL_EVERY
    c.train.checkpoint_every = PLATEAU_ROUNDS // 4
    return c
  c = default.get_config("smoke" if arg == "quick" else None)
  c.sft.base_dir = "../sft_base"  # runs live in <root>/<variant>: one base per root
  c.batch.num_prompts, c.batch.rollouts_per_prompt = 64, 16
  c.batch.num_epochs = 1
  c.drift.probe_prompts = 8  # 128 probe rollouts per round
  c.noise.split_every = 0
  c.noise.chunk_prompts = 2
  c.train.eval_every, c.train.checkpoint_every = 20, 20
  c.train.eval_sampled = False
  c.train.progress = False
  if arg in CLIP_VARIANTS:
    c.batch.num_minibatches = ABLATION_UPDATES
    c.train.num_rounds = ABLATION_ROUNDS
    if arg == "clip10":
      c.rl.clip_eps_low = c.rl.clip_eps_high = 10.0
    elif arg == "asym":
      c.rl.clip_eps_low, c.rl.clip_eps_high = 0.2, 0.28
    elif arg == "cispo":
      c.rl.loss = "cispo"
      c.rl.clip_eps_low, c.rl.clip_eps_high = 10.0, 0.28  # upper bound only (MiniMax-M1)
    elif arg == "dualclip":
      c.rl.clip_c = 3.0
    return c
  if arg == "quick":
    c.task.kwargs.max_digits = 1
    c.model.d_model, c.model.d_ff, c.model.num_layers = 32, 64, 1
    c.sft.steps, c.sft.lr, c.sft.batch_size = 200, 1e-2, 64
    c.batch.num_prompts, c.batch.rollouts_per_prompt = 8, 4
    c.batch.num_minibatches = 4
    c.rl.loss = "pg"
    c.drift.probe_prompts = 2
    c.noise.drift_every = 1
    c.train.num_rounds, c.train.eval_every, c.train.eval_prompts = 4, 2, 32
    return c
  match = re.fullmatch(r"(pg|clip)(\d+)", arg)
  if not match or int(match.group(2)) not in REUSE:
    raise ValueError(
        f"unknown drift_noise variant {arg!r}; known: pg<m>, clip<m> "
        f"(m in {REUSE}), {CLIP_VARIANTS}, quick"
    )
  kind, m = match.group(1), int(match.group(2))
  c.batch.num_minibatches = m
  c.noise.drift_every = 1
  c.train.num_rounds = ROUNDS
  if kind == "pg":
    c.rl.loss = "pg"
  return c
