"""Roofline model: hand-computed numbers from the spec sheets; the probes that
measure this machine's numbers instead."""

import math
import time

import numpy as np
import pytest

from cbs_jax import model
from cbs_jax import probes
from cbs_jax import systems

# A Qwen2.5-0.5B-shaped model: tied embeddings, q/k/v biases, GQA 14:2.
QWEN = dict(
    vocab_size=151936,
    d_model=896,
    num_layers=24,
    num_heads=14,
    num_kv_heads=2,
    d_ff=4864,
    tie_embeddings=True,
    qkv_bias=True,
)
# its parameters, by hand: per layer q,o 896*14*64 each, k,v 896*2*64 each,
# SwiGLU 3*896*4864, two norms 2*896, biases (14+2*2)*64
QWEN_LAYER = 2 * 896 * 14 * 64 + 2 * 896 * 2 * 64 + 3 * 896 * 4864 + 2 * 896 + 18 * 64
QWEN_PARAMS = 151936 * 896 + 24 * QWEN_LAYER + 896  # + final norm; tied: no head
QWEN_KV_TOK_BF16 = 24 * 2 * 2 * 64 * 2  # L * (K,V) * kv heads * dh * 2 bytes


def test_param_counts_match_the_built_model():
  assert QWEN_PARAMS == 494_032_768  # the published "0.49B" of Qwen2.5-0.5B
  d = systems.ModelDims(**QWEN)
  assert d.param_count == QWEN_PARAMS and d.active_params == QWEN_PARAMS  # tied
  for over in (
      {},
      dict(tie_embeddings=True),
      dict(qkv_bias=True, qk_norm=True),
      dict(head_dim=8, value_head=True),
  ):
    c = model.default_config()
    c.vocab_size = 40
    for k, v in over.items():
      c[k] = v
    built = model.param_count(model.build(c)[1])
    dims = systems.ModelDims.from_config(c)
    assert dims.param_count == built, over
  # default model, untied: the gathered 32 x 64 embedding table is not active
  d = systems.ModelDims.from_config(model.default_config())
  per_layer = 64 * 4 * 16 * 2 + 64 * 2 * 16 * 2 + 3 * 64 * 192 + 2 * 64
  assert d.param_count == 32 * 64 + 2 * per_layer + 64 + 64 * 32 == 102_720
  assert d.active_params == 102_720 - 32 * 64


def test_decode_step_h100_by_hand():
  # batch 1, context 1024, bf16 weights and cache
  flops = 2 * QWEN_PARAMS + 4 * 24 * (14 * 64) * 1024
  nbytes = QWEN_PARAMS * 2 + 1024 * QWEN_KV_TOK_BF16
  st = systems.decode_step(QWEN, "h100_sxm", batch=1, context=1024)
  assert st.flops == pytest.approx(flops) and st.bytes == pytest.approx(nbytes)
  assert st.compute_s == pytest.approx(flops / 989e12)
  assert st.memory_s == pytest.approx(nbytes / 3.35e12)
  assert st.bound == "memory" and st.seconds == pytest.approx(1_000_648_448 / 3.35e12)
  assert systems.decode_tokens_per_s(QWEN, "h100_sxm", 1, 1024) == pytest.approx(
      3.35e12 / 1_000_648_448
  )  # ~3348 tokens/s


def test_decode_step_tpu_v5e_by_hand():
  b, c = 512, 1024
  flops = b * (2 * QWEN_PARAMS + 4 * 24 * 896 * c)
  nbytes = 2 * QWEN_PARAMS + b * c * QWEN_KV_TOK_BF16
  st = systems.decode_step(QWEN, "TPU-v5e", b, c)
  assert st.compute_s == pytest.approx(flops / 197e12)  # 2.80 ms
  assert st.memory_s == pytest.approx(nbytes / 819e9)  # 9.07 ms
  assert st.seconds == pytest.approx(7_430_516_480 / 819e9)
  assert systems.decode_tokens_per_s(QWEN, "tpu_v5e", b, c) == pytest.approx(
      b * 819e9 / 7_430_516_480
  )


def test_crossover_batch_closed_form():
  # no KV cache term (context 0): b* = w peak / (2 bw), the ridge for bf16
  assert systems.crossover_batch(QWEN, "h100_sxm", 0) == pytest.approx(989e12 / 3.35e12)
  assert systems.crossover_batch(QWEN, "tpu_v5e", 0) == pytest.approx(197e12 / 819e9)
  # context 128 on H100: solve b (2A + 4 L d_attn c)/peak = (2A + b c kv)/bw
  A, c = QWEN_PARAMS, 128
  per_seq = (2 * A + 4 * 24 * 896 * c) / 989e12 - c * QWEN_KV_TOK_BF16 / 3.35e12
  b_star = (2 * A / 3.35e12) / per_seq
  got = systems.crossover_batch(QWEN, "h100_sxm", c)
  assert got == pytest.approx(b_star)
  assert 500 < b_star < 800  # the KV read pushes it above the 295 ridge
  lo = systems.decode_step(QWEN, "h100_sxm", 0.99 * b_star, c)
  hi = systems.decode_step(QWEN, "h100_sxm", 1.01 * b_star, c)
  at = systems.decode_step(QWEN, "h100_sxm", b_star, c)
  assert lo.bound == "memory" and hi.bound == "compute"
  assert at.compute_s == pytest.approx(at.memory_s)
  # below b*, tokens/s = b bw / (2A + b c kv): sublinear in b through the KV read
  tps = lambda b: systems.decode_tokens_per_s(QWEN, "h100_sxm", b, c)
  mem_tps = lambda b: b * 3.35e12 / (2 * A + b * c * QWEN_KV_TOK_BF16)
  assert tps(b_star / 8) == pytest.approx(mem_tps(b_star / 8))
  assert tps(b_star / 4) / tps(b_star / 8) == pytest.approx(
      mem_tps(b_star / 4) / mem_tps(b_star / 8)
  )
  # above b*, tokens/s = peak / (2A + 4 L d_attn c) per sequence: flat
  assert tps(4 * b_star) == pytest.approx(989e12 / (2 * A + 4 * 24 * 896 * c))
  assert tps(8 * b_star) / tps(4 * b_star) < 1.01
  # GQA 7:1 in bf16: attention does 7 FLOP per KV byte < 295, so at a
  # 1024-token context the step is memory-bound at every batch
  assert systems.crossover_batch(QWEN, "h100_sxm", 1024) == math.inf
  assert systems.decode_step(QWEN, "h100_sxm", 1e6, 1024).bound == "memory"


def test_chips_data_and_model_parallel():
  one = systems.decode_step(QWEN, "h200", 64, 256)
  # data parallel: 4 replicas each decode 64 sequences, same step time
  dp = systems.decode_step(QWEN, "h200", 256, 256, chips=4)
  assert dp.seconds == pytest.approx(one.seconds)
  assert systems.decode_tokens_per_s(QWEN, "h200", 256, 256, chips=4) == pytest.approx(
      4 * systems.decode_tokens_per_s(QWEN, "h200", 64, 256)
  )
  # model parallel: one weight read over 4x the bandwidth and FLOP/s
  mp = systems.decode_step(QWEN, "h200", 64, 256, chips=4, parallel="model")
  assert mp.compute_s == pytest.approx(one.compute_s / 4)
  assert mp.memory_s == pytest.approx(one.memory_s / 4)
  # training FLOPs are shared by the chips either way
  r1 = systems.round_time(QWEN, "h200", 256, 64, 64)
  r4 = systems.round_time(QWEN, "h200", 256, 64, 64, chips=4)
  assert r4.train_s == pytest.approx(r1.train_s / 4)


def test_round_time_by_hand():
  c = model.default_config()  # A = 100672 active, L = 2, d_attn = 64, kv 2 x 16
  A, kv_tok = 100_672, 2 * 2 * 2 * 16 * 2  # bf16 cache: 256 bytes per token
  n, Tp, Tc, peak, bw = 4, 3, 2, 989e12, 3.35e12
  prefill = max(
      n * (2 * A * Tp + 2 * 2 * 64 * Tp * (Tp + 1)) / peak, (2 * A + n * Tp * kv_tok) / bw
  )
  # Tc - 1 = 1 decode forward: token 0 comes from the prefill, token 1 from
  # the forward of token 0, which attends Tp + 1 positions
  decode = sum(
      max(n * (2 * A + 4 * 2 * 64 * ctx) / peak, (2 * A + n * ctx * kv_tok) / bw)
      for ctx in (Tp + 1,)
  )
  T = Tp + Tc
  train_flops = 3 * n * (2 * A * T + 2 * 2 * 64 * T * (T + 1))
  # = 6 A N T + 3 x causal attention (4 L d_attn per query-key pair, T(T+1)/2 pairs)
  assert train_flops == 6 * A * n * T + 3 * n * 4 * 2 * 64 * T * (T + 1) // 2
  r = systems.round_time(c, "h100_sxm", n, Tp, Tc)
  assert r.prefill_s == pytest.approx(prefill)
  assert r.decode_s == pytest.approx(decode)
  assert r.train_flops == pytest.approx(train_flops)
  assert r.train_s == pytest.approx(train_flops / peak)
  assert r.total_s == pytest.approx(prefill + decode + train_flops / peak)
  assert r.rollouts_per_s == pytest.approx(n / (prefill + decode + train_flops / peak))
  assert r.waves == 1 and r.decode_steps == 1 and r.decode_compute_steps == 0
  # mfu 0.5 doubles the update; two epochs + a reference forward: 7 thirds
  r2 = systems.round_time(c, "h100_sxm", n, Tp, Tc, mfu=0.5, epochs=2, extra_forwards=1)
  assert r2.train_s == pytest.approx(train_flops * 7 / 3 / (0.5 * peak))
  # a dense sampler attends all Tp + Tc slots every step
  full = systems.round_time(c, "h100_sxm", n, Tp, Tc, full_cache=True)
  assert full.decode_s == pytest.approx((2 * A + n * (Tp + Tc) * kv_tok) / bw)


def test_kv_memory_splits_decoding_into_waves():
  c = model.default_config()
  weights, per_seq = 102_720 * 2, (3 + 2) * 256  # bf16 weights; 5 cached tokens x 256 B
  toy = systems.Accelerator("toy", 1e12, 1e11, weights + 10 * per_seq + 100)
  assert systems.max_decode_batch(c, toy, 5) == 10
  r = systems.round_time(c, toy, 25, 3, 2)
  assert r.waves == 3  # ceil(25 / 10)
  one = systems.round_time(c, toy, 10, 3, 2)
  assert one.waves == 1
  # each wave decodes 25/3 sequences: memory-bound, so 3 x (weights + b ctx kv) / bw
  b = 25 / 3
  want = 3 * sum((2 * 100_672 + b * ctx * 256) / 1e11 for ctx in (4,))
  assert r.decode_s == pytest.approx(want)
  with pytest.raises(ValueError, match="do not fit"):
    systems.max_decode_batch(c, systems.Accelerator("tiny", 1e12, 1e11, 1000.0), 5)


def test_errors_name_the_bad_value():
  with pytest.raises(ValueError, match=r"unknown accelerator 'a100'.*h100_sxm.*tpu_v4.*cpu"):
    systems.get_accelerator("a100")
  with pytest.raises(ValueError, match=r"unknown accelerator 'a100'.*h100_sxm.*tpu_v4.*cpu"):
    probes.accelerator("a100")
  with pytest.raises(ValueError, match=r"'Cpu' is measured on this machine.*probes.accelerator"):
    systems.get_accelerator("Cpu")
  for bad in (0, -2, 1.5, True):
    with pytest.raises(ValueError, match="chips must be a positive integer"):
      systems.decode_step(QWEN, "h200", 1, 1, chips=bad)
    with pytest.raises(ValueError, match="chips"):
      systems.round_time(QWEN, "h200", 8, 4, 4, chips=bad)
  with pytest.raises(ValueError, match="parallel='pipeline'"):
    systems.round_time(QWEN, "h200", 8, 4, 4, parallel="pipeline")
  with pytest.raises(ValueError, match="mfu"):
    systems.round_time(QWEN, "h200", 8, 4, 4, mfu=0.0)
  with pytest.raises(ValueError, match="completion_len"):
    systems.round_time(QWEN, "h200", 8, 4, 0)
  with pytest.raises(ValueError, match="lacks"):
    systems.ModelDims.from_config(dict(d_model=8))
  with pytest.raises(ValueError, match="num_kv_heads=3"):
    systems.ModelDims(vocab_size=8, d_model=16, num_layers=1, num_heads=4, num_kv_heads=3, d_ff=8)


def test_spec_sheet_entries():
  want = {
      "tpu_v4": (275e12, 1.2e12, 32 * 2**30),
      "tpu_v5e": (197e12, 819e9, 16 * 2**30),
      "tpu_v5p": (459e12, 2.765e12, 95 * 2**30),
      "h100_sxm": (989e12, 3.35e12, 80e9),
      "h200": (989e12, 4.8e12, 141e9),
  }
  for name, (f, b, m) in want.items():
    a = systems.get_accelerator(name)
    assert (a.peak_flops, a.hbm_bandwidth, a.memory_bytes) == pytest.approx((f, b, m))
    assert a.source and a.dtype == "bfloat16"
  assert systems.get_accelerator("h100_sxm").ridge == pytest.approx(989 / 3.35)


def test_calibrate_cpu_is_positive_finite_and_fast():
  t = time.perf_counter()
  a = probes.calibrate_cpu(reps=2)
  elapsed = time.perf_counter() - t
  assert elapsed < 10.0
  for v in (a.peak_flops, a.hbm_bandwidth, a.memory_bytes):
    assert np.isfinite(v) and v > 0
  # plausible for any CPU: 1 GFLOP/s .. 100 TFLOP/s, 0.1 GB/s .. 10 TB/s
  assert 1e9 < a.peak_flops < 1e14 and 1e8 < a.hbm_bandwidth < 1e13
  assert a.dtype == "float32" and a.dtype_bytes == 4
  assert probes.accelerator("CPU") is probes.accelerator("cpu")  # measured once
  assert probes.accelerator("h200") is systems.get_accelerator("h200")


def test_generation_roofline_by_hand():
  """Prefill + Tc - 1 decode steps of the issue-13 benchmark model on a toy
  chip, by hand: FLOPs per token and bytes per step with the KV cache
  actually attended (step t reads Tp + t + 1 positions)."""
  c = model.default_config()
  for k, v in dict(
      vocab_size=64, d_model=128, num_layers=4, num_heads=4, num_kv_heads=4, d_ff=512
  ).items():
    c[k] = v
  A = 1_066_112 - 64 * 128  # all but the input embedding
  kv_tok = 4 * 2 * 4 * 32 * 4  # float32 cache: 4096 bytes per token
  B, Tp, Tc, peak, bw = 1024, 8, 48, 2e11, 2e10
  acc = systems.Accelerator("toy", peak, bw, 1e12, dtype="float32")
  pf_f = B * (2 * A * Tp + 2 * 4 * 128 * Tp * (Tp + 1))
  pf_b = 4 * A + B * Tp * kv_tok
  ctx = Tp + 1 + np.arange(Tc - 1)
  st_f = B * (2 * A + 4 * 4 * 128 * ctx)
  st_b = 4 * A + B * ctx * kv_tok
  secs = max(pf_f / peak, pf_b / bw) + np.maximum(st_f / peak, st_b / bw).sum()
  r = systems.generation_roofline(c, acc, B, Tp, Tc)
  assert r["seconds"] == pytest.approx(secs)
  assert r["tokens_per_s"] == pytest.approx(B * Tc / secs)
  assert r["flops_per_token"] == pytest.approx((pf_f + st_f.sum()) / (B * Tc))
  assert r["bytes_per_step"] == pytest.approx((pf_b + st_b.sum()) / Tc)
  assert r["flops"] == pytest.approx(pf_f + st_f.sum())
  assert r["bytes"] == pytest.approx(pf_b + st_b.sum())
  # the ridge (10 FLOP/byte) sits inside the decode: early steps are
  # compute-bound (2 A per token vs a short cache), the last ones memory-bound
  n_compute = int((st_f / peak >= st_b / bw).sum())
  assert 0 < n_compute < Tc - 1 and r["bound"] == "mixed"


def test_probes_measure_positive_rates():
  mm = probes.MatmulProbe(256)
  bw = probes.BandwidthProbe(16)
  t_mm, t_bw = mm.probe(), bw.probe()
  assert t_mm > 0 and t_bw > 0
  assert mm.flops(2.0) == pytest.approx(2 * 256**3 / 2.0)
  assert bw.bandwidth(2.0) == pytest.approx(16 * 2**20 / 2.0)
  acc = probes.measured_accelerator(mm.flops(t_mm), bw.bandwidth(t_bw))
  assert acc.dtype == "float32" and acc.memory_bytes > 0
