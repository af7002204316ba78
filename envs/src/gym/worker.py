"""normrl's Gymnasium worker: runs one Gymnasium environment and serves it to the Rust
process that started it, over stdin/stdout, in a compact binary protocol.

Started as `python -u <this file> <spec-json>`. All integers little-endian.

Worker -> Rust, first message:
  b"H" u32 n, n bytes of JSON: {"obs_shape", "obs_dtype" ("uint8"|"float32"),
                                "obs_low", "obs_high", "n_actions", "spec_id",
                                "action_meanings"}
  or b"E" u32 n, n bytes of UTF-8: why the environment could not be made.
Rust -> worker:
  b"R" i64 seed (-1: no seed)        reset
  b"S" u32 action                    step
  b"F"                               render
  b"Q"                               quit
Worker -> Rust, after R or S:
  b"K" f64 reward, u8 terminated, u8 truncated, i32 lives (-1: none), observation bytes
  b"E" u32 n, n bytes of UTF-8 (the Python traceback)
Worker -> Rust, after F:
  b"F" u32 height, u32 width, height * width * 3 bytes (RGB, rows top first)
  b"E" u32 n, n bytes of UTF-8 (why there is no frame)

With "preset": "atari" the environment is made with frameskip=1 and grayscale frames,
and each step repeats the action `frame_skip` times, summing rewards and returning the
pixel-wise maximum of the last two frames (DQN's flicker removal); the resizing, frame
stacking, no-op starts, life loss and reward clipping happen on the Rust side.
"""

import importlib
import json
import os
import struct
import sys
import traceback


def send_error(out, message):
    data = message.encode("utf-8", "replace")
    out.write(b"E" + struct.pack("<I", len(data)) + data)
    out.flush()


def need(module, install):
    """Imports `module`, or says exactly what to install into which interpreter."""
    try:
        return importlib.import_module(module)
    except ImportError as e:
        raise RuntimeError(
            "the Gymnasium bridge needs the Python module '%s' (%s) in %s: run `%s -m pip install %s`"
            % (module, e, sys.executable, sys.executable, install)
        )


def finite_or_none(x):
    """JSON has no infinities: unbounded is null."""
    x = float(x)
    return x if np.isfinite(x) and abs(x) < 3e38 else None


def action_meanings(env):
    """ALE's names of the actions (NOOP, FIRE, ...); empty for other environments."""
    try:
        return [str(m) for m in env.unwrapped.get_action_meanings()]
    except Exception:
        return []


def make_env(spec):
    gym = need("gymnasium", "gymnasium")
    env_id = spec["id"]
    kwargs = dict(spec.get("kwargs", {}))
    if env_id.startswith("ALE/") or spec.get("preset") == "atari":
        gym.register_envs(need("ale_py", "ale-py"))
        # The emulator's screen costs nothing to keep: frames for videos on request.
        kwargs.setdefault("render_mode", "rgb_array")
    if spec.get("preset") == "atari":
        kwargs.setdefault("frameskip", 1)
        kwargs.setdefault("obs_type", "grayscale")
        kwargs.setdefault("repeat_action_probability", 0.25)
        if kwargs["frameskip"] != 1:
            raise ValueError(
                "the atari preset skips frames itself: leave the environment's frameskip at 1"
            )
    try:
        env = gym.make(env_id, **kwargs)
    except gym.error.Error as e:
        known = sorted(
            k for k in gym.envs.registry.keys() if "/" not in k or k.startswith("ALE/")
        )
        raise ValueError(
            "Gymnasium cannot make '%s': %s. Some ids it knows: %s"
            % (env_id, e, ", ".join(known[:40]))
        )
    if not isinstance(env.action_space, gym.spaces.Discrete):
        raise ValueError(
            "'%s' has the action space %s; normrl's DQN needs a Discrete action space"
            % (env_id, env.action_space)
        )
    if not isinstance(env.observation_space, gym.spaces.Box):
        raise ValueError(
            "'%s' has the observation space %s; normrl needs a Box observation space"
            % (env_id, env.observation_space)
        )
    return env


def send_frame(out, env, env_id):
    """Replies to F: the RGB frame of `env.render()`, or why there is none."""
    if env.render_mode != "rgb_array":
        send_error(
            out,
            "%s cannot render frames: it was made with render_mode=%r; add "
            "render_mode=rgb_array to its id's options (gym:%s?render_mode=rgb_array)"
            % (env_id, env.render_mode, env_id),
        )
        return
    frame = np.ascontiguousarray(env.render(), dtype=np.uint8)
    if frame.ndim != 3 or frame.shape[2] != 3:
        send_error(out, "%s rendered an array of shape %s, not RGB" % (env_id, frame.shape))
        return
    height, width = frame.shape[:2]
    out.write(b"F" + struct.pack("<II", height, width) + frame.tobytes())


def main():
    out = os.fdopen(os.dup(1), "wb", buffering=0)
    # Whatever the environment prints goes to stderr, never into the protocol stream.
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    inp = os.fdopen(os.dup(0), "rb", buffering=0)

    spec = json.loads(sys.argv[1])
    global np
    try:
        env = make_env(spec)
        import numpy as np
    except Exception as e:
        send_error(out, str(e) or traceback.format_exc())
        return 1

    atari = spec.get("preset") == "atari"
    frame_skip = int(spec.get("frame_skip", 4))
    space = env.observation_space
    dtype = np.uint8 if space.dtype == np.uint8 else np.float32
    header = {
        "obs_shape": list(space.shape),
        "obs_dtype": "uint8" if dtype == np.uint8 else "float32",
        "obs_low": finite_or_none(np.min(space.low)),
        "obs_high": finite_or_none(np.max(space.high)),
        "n_actions": int(env.action_space.n),
        "spec_id": env.spec.id if env.spec is not None else spec["id"],
        "action_meanings": action_meanings(env),
    }
    data = json.dumps(header).encode()
    out.write(b"H" + struct.pack("<I", len(data)) + data)

    pool = np.zeros((2,) + space.shape, dtype=np.uint8) if atari else None

    def lives(info):
        value = info.get("lives")
        return -1 if value is None else int(value)

    def reply(reward, terminated, truncated, n_lives, obs):
        obs = np.ascontiguousarray(obs, dtype=dtype)
        out.write(
            b"K" + struct.pack("<dBBi", reward, terminated, truncated, n_lives) + obs.tobytes()
        )

    read = inp.read
    while True:
        op = read(1)
        if not op or op == b"Q":
            env.close()
            return 0
        try:
            if op == b"R":
                (seed,) = struct.unpack("<q", read(8))
                obs, info = env.reset(seed=None if seed < 0 else seed)
                reply(0.0, False, False, lives(info), obs)
            elif op == b"S":
                (action,) = struct.unpack("<I", read(4))
                if not atari:
                    obs, reward, terminated, truncated, info = env.step(action)
                    reply(float(reward), bool(terminated), bool(truncated), lives(info), obs)
                    continue
                total = 0.0
                terminated = truncated = False
                info = {}
                for i in range(frame_skip):
                    obs, reward, terminated, truncated, info = env.step(action)
                    total += float(reward)
                    if i >= frame_skip - 2:
                        pool[i - (frame_skip - 2)] = obs
                    if terminated or truncated:
                        break
                if frame_skip >= 2 and i == frame_skip - 1:
                    obs = np.maximum(pool[0], pool[1])
                reply(total, terminated, truncated, lives(info), obs)
            elif op == b"F":
                send_frame(out, env, spec["id"])
            else:
                send_error(out, "protocol error: unknown request %r" % op)
                return 2
        except Exception:
            send_error(out, traceback.format_exc())


if __name__ == "__main__":
    sys.exit(main())
