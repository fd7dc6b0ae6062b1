"""A trainer script as a user would write it, with nothing from the checkout:
linear regression by gradient descent, gradients averaged by gradsync
(numpy only, so it starts fast). Used by test_wheel.py (gradsync installed
from the wheel) and test_torchrun.py (started by torchrun).

Usage: standalone_trainer.py OUT_DIR. The socket and local rank come from
the environment ($GRADSYNC_SOCKET, $LOCAL_RANK); writes OUT_DIR/result.<rank>.
"""
import json
import os
import sys

import numpy as np

import gradsync

STEPS = 5
ROWS_PER_TRAINER = 4
DIM = 3
LEARNING_RATE = 0.1


def data(world_size):
    """The global batch, the same on every trainer."""
    rng = np.random.default_rng(7)
    x = rng.standard_normal((world_size * ROWS_PER_TRAINER, DIM))
    y = x @ np.array([1.5, -2.0, 0.5])
    return x, y


def mean_loss_gradient(w, x, y):
    return 2.0 * x.T @ (x @ w - y) / len(y)


def main():
    out = sys.argv[1]
    client = gradsync.Client(connect_timeout_s=20)
    client.register([("w", "float64", DIM)])
    rank, world_size = client.rank, client.world_size
    x, y = data(world_size)
    shard = slice(rank * ROWS_PER_TRAINER, (rank + 1) * ROWS_PER_TRAINER)
    grad = np.frombuffer(client.buffer(0), dtype=np.float64)
    w = np.zeros(DIM)
    for _ in range(STEPS):
        grad[:] = mean_loss_gradient(w, x[shard], y[shard])
        client.mark_ready(0)
        client.wait(timeout_s=20)
        w -= LEARNING_RATE * grad  # the average over trainers: the full batch's
    client.close()
    env = {k: os.environ.get(k) for k in ("LOCAL_RANK", "RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE")}
    with open(os.path.join(out, f"result.{rank}"), "w") as f:
        json.dump({"rank": rank, "world_size": world_size, "w": w.tolist(), "env": env,
                   "library": gradsync.find_library(), "package": gradsync.__file__}, f)


def reference(world_size):
    """The same steps on the whole batch in one process."""
    x, y = data(world_size)
    w = np.zeros(DIM)
    for _ in range(STEPS):
        w -= LEARNING_RATE * mean_loss_gradient(w, x, y)
    return w


if __name__ == "__main__":
    main()
