"""cbs_jax: critical batch size of LLM policy optimization, in JAX/Flax."""

import setuptools

setuptools.setup(
    name="cbs_jax",
    version="0.1.0",
    description=(
        "Measure gradient noise and the critical batch size of "
        "GRPO/PPO policy optimization for LLMs (JAX, Flax NNX)."
    ),
    license="Apache-2.0",
    packages=setuptools.find_packages(include=["cbs_jax", "cbs_jax.*", "configs"]),
    package_data={"cbs_jax.tasks": ["data/*.jsonl"]},
    python_requires=">=3.10",
    install_requires=[
        "jax>=0.6",
        "flax>=0.11",
        "optax>=0.2.4",
        "orbax-checkpoint>=0.11",
        "etils[epath]",  # cbs_jax/paths.py: local and object-store (gs://) paths
        "numpy>=1.26",
        "scipy>=1.10",  # quantiles, bootstrap intervals (stats.py, noise_tracker.py)
        "ml-collections>=0.1.1",
        "absl-py>=2.0",
        "tqdm>=4.60",
        "tensorboardX>=2.6",
        "matplotlib>=3.7",
    ],
    extras_require={
        "test": [
            "pytest>=7",
            "pytest-xdist>=3",
            "hypothesis>=6.80",
            "tokenizers>=0.15",
            "safetensors>=0.4",
            "pyink==26.5.1",  # the formatter (pyproject.toml), pinned: same output
            # CITATION.cff against the Citation File Format schema (tests/test_report.py)
            "jsonschema>=4",
            "pyyaml>=6",
        ],
        "hf": ["tokenizers>=0.15", "safetensors>=0.4"],
        # gs:// workdirs (TPU VMs): epath's Cloud Storage backend (gcsfs)
        "gcs": ["etils[epath-gcs]"],  # Hugging Face checkpoints
        # accelerators (README, "Real models, meshes and pods"): the jax wheels
        # with their backend; never installed by the tests
        "cuda": ["jax[cuda12]>=0.6"],  # NVIDIA GPUs (CUDA 12 from pip wheels)
        "tpu": ["jax[tpu]>=0.6"],  # Cloud TPU VMs (libtpu)
        # logits parity against transformers (tests/test_hf.py); CI installs it
        # (.ci/run: pip install -e ".[test,parity]"). The torch bound keeps pip on
        # a 2.13 release: where the 2.13.0 CPU wheel is on find-links (this machine
        # kind) pip takes it (~1.2 GB installed, ~1-2 min); a newer torch pulls
        # its CUDA libraries (~5.6 GB) even on CPU. transformers >= 4.51 has Qwen3.
        # the peer benchmark (experiments/bench_peers.py): Tunix's sampler, pinned
        "peers": ["google-tunix==0.1.7"],
        "parity": [
            "torch>=2.4,<2.14",
            "transformers>=4.51",
            "tokenizers>=0.15",
            "safetensors>=0.4",
        ],
    },
)
