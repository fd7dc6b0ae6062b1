"""Helpers for targets that need CUDA + NCCL."""

load("@local_cuda//:defs.bzl", "HAS_CUDA")

def gpu_compatible():
    """target_compatible_with for GPU targets: skipped without CUDA or with --define=gpu=off."""
    if not HAS_CUDA:
        return ["//:incompatible"]
    return select({
        "//:gpu_off": ["//:incompatible"],
        "//conditions:default": [],
    })

def if_gpu(if_true, if_false = []):
    """Selects if_true when the GPU backend is built."""
    if not HAS_CUDA:
        return if_false
    return select({
        "//:gpu_off": if_false,
        "//conditions:default": if_true,
    })
