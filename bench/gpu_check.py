"""`make gpu-check`: the checks to run once when a GPU machine is lent (under 5 minutes).

On CUDA: the real-model engine tests (greedy output equals `generate`, in the GPU's bf16),
then a short `python -m bench --quick` on the GPU, whose figures go into docs/performance.md.
Without CUDA it says so and stops: nothing here is meaningful on a CPU.
"""
import subprocess
import sys

import torch


def main():
    if not torch.cuda.is_available():
        print(f"gpu-check: no CUDA device (torch {torch.__version__}, built for CUDA "
              f"{torch.version.cuda or 'none'}): nothing to check on this machine")
        return 0
    print(f"gpu-check: {torch.cuda.get_device_name(0)}, torch {torch.__version__}, CUDA {torch.version.cuda}",
          flush=True)
    steps = [[sys.executable, "-m", "pytest", "-q", "tests/engine/test_engine_real.py"],
             [sys.executable, "-m", "bench", "--quick", "--skip-hf", "--device", "cuda",
              "--out", "bench/results-cuda.json"]]
    failed = 0
    for cmd in steps:
        print("gpu-check: $", " ".join(cmd[1:]), flush=True)
        failed += subprocess.run(cmd).returncode != 0
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
