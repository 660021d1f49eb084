"""Multi-device: (data, fsdp, tensor) mesh from the config, logical-axis
shardings of parameters and optimizer state, and sharded runs equal to a
single-device one. Each multi-device run is a subprocess with 8 host CPU
devices (XLA_FLAGS set before jax loads)."""

import json
import os
import subprocess
import sys

import pytest

from cbs_jax import config as config_lib
from cbs_jax import metrics as metrics_lib
from cbs_jax import sharding
from envs import host_devices

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
EIGHT = host_devices(8)

SPECS = r"""
import json, jax, jax.numpy as jnp
from cbs_jax import model, sharding, updater
from configs import default
c = model.default_config(); c.vocab_size = 16; c.num_kv_heads = 1
g, p = model.build(c)
mesh = sharding.make_mesh(2, 2, 2)
rules = sharding.DEFAULT_RULES
psh = sharding.param_shardings(p, mesh, rules)
ps = jax.device_put(p, psh)
tx = updater.make_optimizer(default.get_config().optim)
opt = sharding.shard_state(tx.init(ps), ps, psh, mesh)
out = {}
for k, x in jax.tree_util.tree_flatten_with_path(ps)[0]:
  out["params" + jax.tree_util.keystr(k)] = [list(x.sharding.spec), len(x.sharding.device_set),
                                             x.addressable_shards[0].data.size, x.size]
for k, x in jax.tree_util.tree_flatten_with_path(opt)[0]:
  out["opt" + jax.tree_util.keystr(k)] = [list(x.sharding.spec), len(x.sharding.device_set),
                                          x.addressable_shards[0].data.size, x.size]
b = sharding.shard_batch({"x": jnp.zeros((16, 3)), "y": jnp.zeros((6,))}, mesh)
out["batch_x"] = [list(b["x"].sharding.spec), 8, b["x"].addressable_shards[0].data.size, 48]
out["batch_y"] = [list(b["y"].sharding.spec), 8, b["y"].addressable_shards[0].data.size, 6]
# the KV cache inside the jitted sampler: per-device buffers of the compiled
# program, [B/4 rows, KV/2 heads, ...] (B=16 over data x fsdp, 4 kv heads over tensor)
from cbs_jax import sampling, scoring
c2 = model.default_config(); c2.vocab_size = 16; c2.num_kv_heads = 4
g2, p2 = model.build(c2)
p2 = sharding.shard_params(p2, mesh)
pb = sharding.shard_batch({"p": jnp.ones((16, 6), jnp.int32), "m": jnp.ones((16, 6), bool)}, mesh)
smp = sampling.make_sampler(g2, max_new_tokens=8, eos_id=1, pad_id=0,
                            spec=scoring.SamplingSpec())
hlo = smp.lower(p2, pb["p"], pb["m"], jax.random.key(0)).compile().as_text()
out["kv_full"] = hlo.count("f32[16,4,")
out["kv_sharded"] = hlo.count("f32[4,2,")
print(json.dumps(out))
"""


@pytest.mark.slow
def test_parameters_and_optimizer_state_shard_by_logical_axis_names():
  r = subprocess.run(
      [sys.executable, "-c", SPECS],
      cwd=ROOT,
      env=EIGHT,
      capture_output=True,
      text=True,
      timeout=300,
  )
  assert r.returncode == 0, r.stderr[-2000:]
  specs = json.loads(r.stdout.strip().splitlines()[-1])
  get = lambda frag, pre="params": next(
      v for k, v in specs.items() if k.startswith(pre) and frag in k
  )
  P = lambda frag: get(frag)[0]
  assert P("['attn']['wq']") == ["fsdp", "tensor", None]  # embed over fsdp, heads over tensor
  assert P("['mlp']['w_up']") == ["fsdp", "tensor"]
  assert P("['mlp']['w_down']") == ["tensor", "fsdp"]
  assert P("['attn']['wo']") == ["tensor", None, "fsdp"]
  assert P("['attn']['wk']") == ["fsdp", None, None]  # 1 kv head: not divisible
  assert P("['embed']") == ["tensor", "fsdp"]  # vocab 16 over tensor
  assert P("['final_norm']['scale']") == ["fsdp"]
  # each device holds 1/4 of a matrix sharded over fsdp x tensor
  wq = get("['blocks'][0]['attn']['wq']")
  assert wq[2] * 4 == wq[3] and wq[1] == 8
  # Adam's moments are sharded like their parameters; counts replicated
  opt = {k: v for k, v in specs.items() if k.startswith("opt")}
  mu_wq = next(v for k, v in opt.items() if "mu" in k and "['attn']['wq']" in k)
  nu_up = next(v for k, v in opt.items() if "nu" in k and "['mlp']['w_up']" in k)
  assert mu_wq[0] == ["fsdp", "tensor", None] and mu_wq[2] * 4 == mu_wq[3]
  assert nu_up[0] == ["fsdp", "tensor"]
  assert all(v[0] == [] for k, v in opt.items() if "count" in k)
  # the sampler's KV cache [B, KV, S, Dh] lives as [B/4, KV/2, ...] per device,
  # never whole on one
  assert specs["kv_full"] == 0 and specs["kv_sharded"] > 0, (specs["kv_full"], specs["kv_sharded"])
  # batches: rollouts over (data, fsdp) = 4 shards; 6 rows: over data only
  assert specs["batch_x"][0] == [["data", "fsdp"]] and specs["batch_x"][2] == 12
  assert specs["batch_y"][0] == ["data"] and specs["batch_y"][2] == 3


def test_mesh_shape_from_config():
  assert sharding.mesh_shape(-1, 1, 1, 8) == (8, 1, 1)
  assert sharding.mesh_shape(-1, 2, 2, 8) == (2, 2, 2)
  assert sharding.mesh_shape(2, -1, 1, 8) == (2, 4, 1)
  assert sharding.mesh_shape(1, 1, -1, 8) == (1, 1, 8)
  with pytest.raises(
      ValueError,
      match=r"config.mesh.data=2 x config.mesh.fsdp=2 x "
      r"config.mesh.tensor=1 = 4 devices, but there are 8 devices",
  ):
    sharding.mesh_shape(2, 2, 1, 8)
  with pytest.raises(ValueError, match=r"fixed axes \(3 devices\) do not divide the 8"):
    sharding.mesh_shape(-1, 1, 3, 8)
  with pytest.raises(ValueError, match="at most one mesh axis may be -1"):
    sharding.mesh_shape(-1, -1, 1, 8)
  c = config_lib.base_config()
  c.mesh.fsdp = 0
  with pytest.raises(ValueError, match=r"config.mesh.fsdp must be a positive integer or -1"):
    config_lib.validate(c)
  c.mesh.fsdp, c.mesh.rules = 1, "embed=model"
  with pytest.raises(ValueError, match=r"config.mesh.rules=.*mesh axis 'model' is not one of"):
    config_lib.validate(c)


def run(workdir, env, *flags):
  cmd = [
      sys.executable,
      "-m",
      "cbs_jax.main",
      "--config=configs/default.py:smoke",
      f"--workdir={workdir}",
      "--config.task.kwargs.max_digits=1",
      "--config.sft.steps=60",
      "--config.sft.lr=0.01",
      *flags,
  ]
  r = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
  assert r.returncode == 0, r.stderr[-3000:]
  return metrics_lib.read_jsonl(os.path.join(workdir, "metrics.jsonl"))


def assert_same_run(one, other):
  assert [r["round"] for r in one] == [r["round"] for r in other]
  for a, b in zip(one, other):
    assert a.get("eval_pass_rate") == b.get("eval_pass_rate")
    if a["round"]:
      assert a["reward_mean"] == b["reward_mean"]
      # float32 sums in another order on 8 devices: parameters drift by ~1e-6
      # per update, and entropy (a mean of logs) shows it first
      assert a["entropy"] == pytest.approx(b["entropy"], rel=1e-3)
      assert a["loss"] == pytest.approx(b["loss"], abs=1e-5)
      # noise statistics of the same rollouts: g2 (~0.1 here) is a small
      # difference of large squared norms, so its error is absolute
      assert a["noise_split/trace_intra"] == pytest.approx(b["noise_split/trace_intra"], rel=5e-3)
      assert a["noise_split/g2"] == pytest.approx(b["noise_split/g2"], abs=1e-3)


@pytest.mark.slow
def test_sharded_run_matches_single_device(tmp_path):
  one = run(str(tmp_path / "one"), dict(os.environ))
  mesh = run(
      str(tmp_path / "mesh"),
      EIGHT,
      "--config.mesh.data=2",
      "--config.mesh.fsdp=2",
      "--config.mesh.tensor=2",
  )
  assert_same_run(one, mesh)


@pytest.mark.slow
def test_mesh_not_matching_the_devices_is_an_error(tmp_path):
  cmd = [
      sys.executable,
      "-m",
      "cbs_jax.main",
      "--config=configs/default.py:smoke",
      f"--workdir={tmp_path}",
      "--config.mesh.tensor=3",
  ]
  r = subprocess.run(cmd, cwd=ROOT, env=EIGHT, capture_output=True, text=True, timeout=300)
  assert r.returncode != 0
  assert "config.mesh.tensor=3" in r.stderr and "8 devices" in r.stderr, r.stderr[-2000:]
  assert not os.path.exists(tmp_path / "checkpoints" / "1")  # failed before any work


SLOW = os.environ.get("CBS_JAX_SLOW") == "1"


@pytest.mark.slow
@pytest.mark.skipif(
    not SLOW,
    reason="~20 min on 2 cores: set CBS_JAX_SLOW=1 to run the 25M "
    "config on one device and on a (2, 2, 2) mesh of 8",
)
def test_25m_config_on_a_mesh_matches_one_device(tmp_path):
  """configs/arithmetic_25m.py: ~25M parameters, three GRPO rounds end to end
  on one device and on a (data 2, fsdp 2, tensor 2) mesh of 8 host devices,
  from the same SFT base: the same rollouts and rewards, the same losses
  and noise statistics up to float32 summation order."""
  from configs import arithmetic_25m  # pylint: disable=import-outside-toplevel
  from cbs_jax import model as model_lib  # pylint: disable=import-outside-toplevel

  c = arithmetic_25m.get_config()
  c.model.vocab_size = 17  # the task's character vocabulary (train.prepare sets it)
  assert model_lib.param_count(model_lib.build(c.model)[1]) == 25_191_936
  cmd = lambda w, *f: [
      sys.executable,
      "-m",
      "cbs_jax.main",
      "--config=configs/arithmetic_25m.py",
      f"--workdir={w}",
      *f,
  ]
  one = tmp_path / "one"
  r = subprocess.run(
      cmd(one), cwd=ROOT, env=dict(os.environ), capture_output=True, text=True, timeout=1800
  )
  assert r.returncode == 0, r.stderr[-3000:]
  r = subprocess.run(
      cmd(
          tmp_path / "mesh",
          f"--config.sft.base_dir={one / 'sft_base'}",
          "--config.mesh.data=2",
          "--config.mesh.fsdp=2",
          "--config.mesh.tensor=2",
      ),
      cwd=ROOT,
      env=EIGHT,
      capture_output=True,
      text=True,
      timeout=1800,
  )
  assert r.returncode == 0, r.stderr[-3000:]
  a = metrics_lib.read_jsonl(str(one / "metrics.jsonl"))
  b = metrics_lib.read_jsonl(str(tmp_path / "mesh" / "metrics.jsonl"))
  assert len(a) == 4
  assert_same_run(a, b)
