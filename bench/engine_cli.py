"""The command line the in-process engine benches share (bench/prompt_logprobs.py,
bench/structured.py): model threads, device, a JSON copy of the figures with the processor named,
and the engine on the bundled model."""
import json

from bench import machine


def add_flags(ap):
    ap.add_argument("--threads", type=int, default=None, help="model threads (default: torch's)")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--out", default=None, help="also write the figures as JSON here")


def make_engine(args, **config):
    """The bundled model's engine under `args`' threads and device (EngineConfig keywords)."""
    if args.threads:
        import torch
        torch.set_num_threads(args.threads)
    from engine import Engine, EngineConfig
    from engine.model import loading as model_mod
    return Engine(model_mod.load(device=args.device), EngineConfig(**config))


def write(args, figures):
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"machine": machine.processor(), "device": args.device, **figures}, f, indent=1)
