"""GRPO on GSM8K with a Qwen2.5-0.5B-class policy, for a TPU pod slice / GPU node.

    python -m cbs_jax.main --config=configs/gsm8k_qwen.py --workdir=runs/gsm8k_qwen \
        --config.task.kwargs.path=/data/gsm8k/train.jsonl \
        --config.hf_checkpoint=/data/Qwen2.5-0.5B

``get_config("smoke")`` keeps every choice below but shrinks the model and
points at the committed example problems, so that the config builds,
validates and constructs its task on a CPU (tests/test_hf.py).

Choices:
* model: the shape of Qwen2.5-0.5B's config.json (896 wide, 24 layers, 14
  query / 2 key-value heads of 64, SwiGLU 4864, RoPE theta 1e6, q/k/v
  biases, tied embeddings, RMSNorm eps 1e-6) as ``hf.model_config_from_hf``
  builds it, bfloat16 compute; ``max_len`` 2048 covers GSM8K prompt +
  solution even in characters (train.prepare checks it against the task).
* batch: P=64 prompts x K=16 rollouts = 1,024 rollouts per round; Adam at
  1e-6 for that batch (``ref_batch``), sqrt rule when P or K change.
* KL penalty off and symmetric clip 0.2 (plain GRPO); split-microbatch noise
  tracker every round; the exact per-rollout path is off (at 0.5B it needs a
  per-rollout gradient per vmap lane; enable with chunk_prompts=1 if memory
  allows); no exact expected-pass eval (GSM8K answers are not enumerable).
* mesh: data parallel over all devices, parameters replicated (0.5B in
  float32 + Adam is ~6 GB per chip); ``--config.mesh.tensor=4`` shards
  vocab / heads / MLP over 4 chips instead.

What remains before this runs end to end (not wired in train.py yet):
* ``hf_checkpoint`` is not read by the trainer: ``train.prepare`` /
  ``sft_base`` must call ``hf.load(config.hf_checkpoint, mesh=mesh)`` for the
  initial (and reference) params and use its tokenizer instead of the
  task's CharTokenizer (vocab_size then comes from the checkpoint), and RL
  should start from those params without the SFT warm start.
* Layout lengths are the task's character counts; with a BPE tokenizer they
  should be measured in tokens (about 3-4x shorter), and
  ``sampling.max_new_tokens`` set in tokens (e.g. 512).
* The held-out split: GSM8K's test file is the eval set; the task's
  train/eval split key is being added to tasks/gsm8k.py separately.
"""
import ml_collections

from cbs_jax.tasks import gsm8k
from configs import default

# the user's copy of GSM8K (main/train, one {"question", "answer"} object per line)
DATA_PATH = "/data/gsm8k/train.jsonl"
# the user's copy of a Qwen2.5-0.5B checkpoint (config.json, *.safetensors, tokenizer.json)
CHECKPOINT_DIR = "/data/Qwen2.5-0.5B"


def get_config(arg=None):
  c = default.get_config()
  with c.unlocked():
    c.task.name = "gsm8k"
    # replaces arithmetic's kwargs: GSM8KTask takes the data file only
    c.task.kwargs = ml_collections.ConfigDict({"path": DATA_PATH})
    c.hf_checkpoint = CHECKPOINT_DIR  # Hugging Face checkpoint to start from (see above)

  m = c.model                 # Qwen2.5-0.5B (hf.model_config_from_hf of its config.json)
  m.vocab_size = 151936       # replaced by the tokenizer's size in train.prepare
  m.d_model = 896
  m.num_layers = 24
  m.num_heads = 14
  m.num_kv_heads = 2
  m.head_dim = 0              # = 896 / 14 = 64
  m.d_ff = 4864
  m.max_len = 2048            # prompt + completion slots of the KV cache
  m.rope_theta = 1_000_000.0
  m.rope_scaling = ""
  m.norm_eps = 1e-6
  m.qkv_bias = True
  m.qk_norm = False
  m.tie_embeddings = True
  m.dtype = "bfloat16"        # compute; parameters stay float32 for Adam

  c.sampling.temperature = 1.0
  c.sampling.max_new_tokens = 0     # the task's longest solution + 1 (characters today)

  c.rl.algo = "grpo"
  c.rl.advantage = "grpo"
  c.rl.loss = "ppo"
  c.rl.aggregation = "token_mean"
  c.rl.clip_eps_low = 0.2
  c.rl.clip_eps_high = 0.2
  c.rl.kl_beta = 0.0

  c.batch.num_prompts = 64          # P
  c.batch.rollouts_per_prompt = 16  # K -> N = 1,024 rollouts per round
  c.batch.num_minibatches = 1

  c.optim.lr = 1e-6                 # at ref_batch rollouts
  c.optim.ref_batch = 1024
  c.optim.lr_rule = "sqrt"
  c.optim.warmup_steps = 10
  c.optim.grad_clip = 1.0

  c.train.num_rounds = 500
  c.train.eval_every = 50
  c.train.eval_prompts = 512        # pass@1 SE ~0.02
  c.train.eval_expected = False     # GSM8K answers are not enumerable
  c.train.checkpoint_every = 25
  c.train.progress = False          # pod logs, not a console

  c.noise.split_every = 1
  c.noise.exact_every = 0
  c.noise.chunk_prompts = 1

  c.mesh.data = -1
  c.mesh.fsdp = 1
  c.mesh.tensor = 1

  if arg == "smoke":
    c.task.kwargs.path = gsm8k.DEFAULT_PATH
    m.d_model, m.num_layers, m.num_heads, m.num_kv_heads, m.d_ff = 64, 2, 4, 2, 96
    c.batch.num_prompts, c.batch.rollouts_per_prompt = 4, 4
    c.train.num_rounds, c.train.eval_prompts = 2, 8
  elif arg:
    raise ValueError(f"unknown config argument {arg!r}; known: 'smoke'")
  return c
