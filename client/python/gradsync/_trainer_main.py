"""How ``python3 -m gradsync.run`` starts each trainer: choose its GPU, then
run the script exactly as ``python3 SCRIPT ARGS`` (or ``-m MODULE``) would.

    python3 -m gradsync._trainer_main SCRIPT ARGS...
    python3 -m gradsync._trainer_main -m MODULE ARGS...

When torch is installed and CUDA is available, ``torch.cuda.set_device``
selects GPU ``LOCAL_RANK % device_count()`` before the script's first line,
so ``torch.device("cuda")`` and ``.cuda()`` mean this trainer's own GPU, as
under torchrun + DDP's usual ``set_device(local_rank)``. Without torch or
CUDA nothing is imported or changed.
"""
from __future__ import annotations

import importlib.util
import os
import runpy
import sys


def select_device() -> None:
    """Sets torch's current CUDA device from ``$LOCAL_RANK``, if there is one."""
    if importlib.util.find_spec("torch") is None:
        return
    import torch  # the trainer imports it anyway; only then is it paid here
    if not torch.cuda.is_available():
        return
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    torch.cuda.set_device(local_rank % torch.cuda.device_count())


def main() -> None:
    args = sys.argv[1:]
    if not args:
        sys.exit("usage: python3 -m gradsync._trainer_main (SCRIPT | -m MODULE) [ARGS...]")
    select_device()
    if args[0] == "-m":
        if len(args) < 2:
            sys.exit("gradsync._trainer_main: -m needs a module name")
        sys.argv = [args[1]] + args[2:]
        runpy.run_module(args[1], run_name="__main__", alter_sys=True)
    else:
        script = args[0]
        sys.argv = [script] + args[1:]
        # As `python3 SCRIPT` does: the script's directory comes first on the path.
        sys.path[0] = os.path.dirname(os.path.abspath(script))
        runpy.run_path(script, run_name="__main__")


if __name__ == "__main__":
    main()
