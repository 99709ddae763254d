"""What a reader needs to reproduce or discount a run: device, versions, git sha, command, load."""

import os
import platform
import subprocess
import sys
import time

import torch

__all__ = ["device_name", "environment", "git_sha", "load_average", "memory_child_env"]


def memory_child_env() -> dict:
    """The environment of a child process whose RSS is measured.

    glibc keeps freed heap pages resident and reuses them without touching new pages, so RSS overstates
    what is live by whatever the last phase freed. With a fixed mmap threshold every block of 128 KiB or
    more is mapped on allocation and unmapped on free, and RSS follows the live memory.
    """
    return dict(os.environ, MALLOC_MMAP_THRESHOLD_="131072", MALLOC_TRIM_THRESHOLD_="131072")


def git_sha() -> str:
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    try:
        sha = subprocess.run(["git", "rev-parse", "HEAD"], cwd=root, capture_output=True, text=True, timeout=10)
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no", "--", "fastrl", "bench"],
            cwd=root,
            capture_output=True,
            text=True,
            timeout=10,
        )
    except (OSError, subprocess.TimeoutExpired):
        return "unknown"
    if sha.returncode != 0:
        return "unknown (not a git checkout)"
    return sha.stdout.strip() + ("+dirty" if dirty.stdout.strip() else "")


def device_name(device: torch.device) -> str:
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    model = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    model = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    return f"{model} ({os.cpu_count()} cores, torch threads {torch.get_num_threads()})"


def load_average() -> str:
    try:
        with open("/proc/loadavg") as f:
            return " ".join(f.read().split()[:3])
    except OSError:
        return "n/a"


def environment(device: torch.device) -> dict:
    """What a reader needs to reproduce or discount the numbers."""
    try:
        import triton

        triton_version = triton.__version__
    except ImportError:
        triton_version = None
    return {
        "device": device_name(device),
        "device_type": device.type,
        "torch": torch.__version__,
        "triton": triton_version,
        "cuda": torch.version.cuda,
        "python": platform.python_version(),
        "git_sha": git_sha(),
        "timestamp_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "command": " ".join(["python -m bench"] + sys.argv[1:]),
        "load_average_start": load_average(),
        "fastrl_env": {k: v for k, v in os.environ.items() if k.startswith("FASTRL_")},
    }
