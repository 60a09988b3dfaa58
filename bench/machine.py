"""The processor a figure was measured on, named in every results file and table: the machines
here change processors between weeks (an AMD EPYC with AVX2 one week, an Intel Xeon with
AVX-512 and AMX the next), and a figure means little without it."""
import functools
import os


@functools.lru_cache(maxsize=None)
def processor():
    """{"model": lscpu's model name, "isa": the widest vector ISA, "cores": N} from /proc/cpuinfo."""
    model, flags = "unknown", set()
    try:
        for line in open("/proc/cpuinfo"):
            key, _, value = line.partition(":")
            if key.strip() == "model name" and model == "unknown":
                model = value.strip()
            elif key.strip() == "flags" and not flags:
                flags = set(value.split())
    except OSError:
        pass
    isa = ("AVX-512" + (" + AMX" if "amx_tile" in flags else "") if "avx512f" in flags
           else "AVX2" if "avx2" in flags else "no AVX2")
    return {"model": model, "isa": isa, "cores": os.cpu_count()}


def describe():
    p = processor()
    return f"{p['model']} ({p['isa']}, {p['cores']} cores)"
