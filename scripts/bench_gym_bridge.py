"""Steps/s of ALE Breakout in plain Python, to set beside `normrl env bench` on the
Gymnasium bridge (same random-action loop, one process, one core).

Usage: python scripts/bench_gym_bridge.py [STEPS]   (needs gymnasium and ale-py)

Prints one line per case:
  raw-v5      gym.make("ALE/Breakout-v5"): frameskip 4 inside ALE, RGB frames.
              Compare with `normrl env bench --env gym:ALE/Breakout-v5`.
  preset-work what the bridge's worker does per agent step for `preset=atari`:
              frameskip 1 + grayscale, four env.step calls, max of the last two frames.
              Compare with `normrl env bench --env 'gym:ALE/Breakout-v5?preset=atari'`.
"""

import sys
import time

import ale_py
import gymnasium as gym
import numpy as np

gym.register_envs(ale_py)
STEPS = int(sys.argv[1]) if len(sys.argv) > 1 else 20000


def raw_v5():
    env = gym.make("ALE/Breakout-v5")
    rng = np.random.default_rng(1)
    env.reset(seed=1)
    n = env.action_space.n
    start = time.perf_counter()
    for _ in range(STEPS):
        _, _, terminated, truncated, _ = env.step(int(rng.integers(n)))
        if terminated or truncated:
            env.reset()
    return STEPS / (time.perf_counter() - start)


def preset_work():
    env = gym.make("ALE/Breakout-v5", frameskip=1, obs_type="grayscale")
    rng = np.random.default_rng(1)
    env.reset(seed=1)
    n = env.action_space.n
    pool = np.zeros((2, 210, 160), dtype=np.uint8)
    start = time.perf_counter()
    for _ in range(STEPS):
        action = int(rng.integers(n))
        done = False
        for i in range(4):
            obs, _, terminated, truncated, _ = env.step(action)
            if i >= 2:
                pool[i - 2] = obs
            if terminated or truncated:
                done = True
                break
        if not done:
            np.maximum(pool[0], pool[1]).tobytes()
        else:
            env.reset()
    return STEPS / (time.perf_counter() - start)


for name, case in [("raw-v5", raw_v5), ("preset-work", preset_work)]:
    case()  # warm-up on the first pass would skew; run each twice, keep the second
    print(f"{name:<12} {case():>10.0f} steps/s")
