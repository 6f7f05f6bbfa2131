#!/usr/bin/env python3
"""A stand-in for a training script: it "trains" by counting steps, and survives preemption.

It shows the checkpoint contract with nothing but the standard library and
``gpuportal.checkpoint``:

- it saves its state every ``--save-every`` steps, atomically, and points the marker at it;
- when the portal asks for a checkpoint (the signal in ``GPUPORTAL_CHECKPOINT_SIGNAL``), it
  saves at the end of the current step and exits, so the portal can give its GPUs to
  someone else;
- when the portal starts it again (``GPUPORTAL_RESUME=1``), it continues from the saved
  step instead of step 0.

Submit it with ``examples/train_counter.yaml``, which runs it by name from the job's PATH (an
executable with a ``python3`` shebang, as an image would install it). Outside the portal, give a
directory: ``python examples/train_counter.py --checkpoint-dir /tmp/ckpt``.
"""

from __future__ import annotations

import argparse
import math
import sys
import time

from gpuportal.checkpoint import Checkpointer


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=1000, help="train this many steps in total")
    parser.add_argument("--save-every", type=int, default=100, help="save every N steps")
    parser.add_argument("--step-seconds", type=float, default=0.05, help="how long one step takes")
    parser.add_argument("--report-every", type=int, default=10, help="print progress every N steps")
    parser.add_argument("--checkpoint-dir", help="default: GPUPORTAL_CHECKPOINT_DIR (set by the portal)")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    ckpt = Checkpointer(args.checkpoint_dir)
    state = ckpt.load_json() if ckpt.resume else None
    if state is None:
        state = {"step": 0, "loss": 1.0}
        print("starting from step 0", flush=True)
    else:
        print(f"resumed from step {state['step']}", flush=True)

    while state["step"] < args.steps:
        time.sleep(args.step_seconds)  # the "work" of one step
        state["step"] += 1
        state["loss"] = math.exp(-state["step"] / max(args.steps, 1) * 3)
        step = state["step"]
        if step % args.report_every == 0:
            print(f"step {step} loss {state['loss']:.4f}", flush=True)
        if ckpt.requested:
            # Say it before saving: once the marker exists the agent may stop the job at once.
            print(f"checkpoint requested at step {step}: saving and exiting", flush=True)
            ckpt.save_json(step, state, metric=state["loss"])
            return 0
        if step % args.save_every == 0:
            ckpt.save_json(step, state, metric=state["loss"])
            print(f"saved step {step}", flush=True)

    ckpt.save_json(state["step"], state)
    print(f"done at step {state['step']}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
