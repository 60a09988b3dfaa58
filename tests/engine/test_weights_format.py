"""The `weights` setting on a tiny model stored as ggml blocks (tests/helpers.py tiny_quant_bundle):
the engine reads the blocks through the fused kernel or the fp32 copy, live, with the same greedy
output as `generate`, and every step says which it read and how many bytes."""
import pytest

from engine import Engine, EngineConfig, SettingError
from engine.model import kernels
from engine import events as ev
from engine.settings import validate
from engine.model.weights import BF16, F16, KIND_NAMES, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0
from helpers import reference, tiny_quant_bundle
from stepping import Run
from test_engine import PROMPTS


@pytest.fixture(scope="module", params=[Q4_1, Q8_0], ids=["Q4_1", "Q8_0"])
def quant(request):
    return tiny_quant_bundle(kind=request.param)


def make(bundle, **kw):
    return Engine(bundle, EngineConfig(**{"slots": 4, "kv_tokens": 4096, "block_size": 16, "max_context": 512, **kw}))


def test_the_blocks_are_read_by_default_and_both_copies_are_offered(quant):
    e = make(quant)
    assert e.settings.now.scheduling.weights == "stored"
    assert e.specs["weights"].choices == ("stored", "dequantised")
    w = e.hello().weights
    stored, fp32 = w["formats"]["stored"], w["formats"]["dequantised"]
    blocks = sum(q.nbytes for n, q in quant.quant.items() if n.startswith("model.layers."))
    norms = sum(p.numel() * 4 for n, p in quant.model.named_parameters() if "norm" in n)
    assert stored["decode_bytes"] == blocks + quant.quant["lm_head.weight"].nbytes + norms
    assert fp32["decode_bytes"] == sum(p.numel() * 4 for p in quant.model.parameters())   # tied head: once
    assert stored["decode_bytes"] < fp32["decode_bytes"]
    assert stored["floor_s"] / fp32["floor_s"] == pytest.approx(stored["decode_bytes"] / fp32["decode_bytes"])
    assert w["kernel"] in ("avx512", "avx2", "portable")


@pytest.mark.parametrize("weights", ["stored", "dequantised"])
def test_greedy_output_equals_generate_reading_either_copy(quant, weights):
    e = make(quant)
    e.apply_settings(validate(e.specs, {"weights": weights}))
    run = Run(e)
    ids = [run.add(p, max_new_tokens=12, temperature=0.0, ignore_eos=True) for p in PROMPTS[:4]]
    run.until_idle()
    for rid, prompt in zip(ids, PROMPTS):
        assert run.tokens(rid) == reference(quant, prompt, 12)
    steps = run.of(ev.Step)
    assert {s.weights for s in steps} == {weights}
    fmt = e.hello().weights["formats"][weights]
    assert max(s.tokens for s in steps) > 24       # prompt chunks too: every row count reads the same copy
    for s in steps:
        # the stored blocks' kernel is named by their type (Q4_1 or Q8_0 here)
        assert s.kernel == ("oneDNN fp32" if weights == "dequantised" else f"{quant.quant['lm_head.weight'].name} {kernels.status()['isa']}")
        assert s.weight_bytes == fmt["decode_bytes"]


@pytest.mark.parametrize("kind", [Q4_0, Q5_0, Q5_1, F16, BF16], ids=lambda k: KIND_NAMES[k])
def test_each_block_type_is_read_as_stored_with_greedy_equal_to_generate(kind):
    """The tiny model stored in the other types gguf quantises (its 64-wide rows hold no K-quant
    super-block: tests/engine/test_kernels.py holds those to the fp32 matmul): the engine reads the
    blocks, each step's kernel and hello's blocks name the type, and greedy equals `generate` on the
    weights they mean."""
    bundle = tiny_quant_bundle(kind=kind)
    e = make(bundle)
    assert e.hello().weights["formats"]["stored"]["blocks"] == [KIND_NAMES[kind]]
    run = Run(e)
    ids = [run.add(p, max_new_tokens=8, temperature=0.0, ignore_eos=True) for p in PROMPTS[:2]]
    run.until_idle()
    for rid, prompt in zip(ids, PROMPTS):
        assert run.tokens(rid) == reference(bundle, prompt, 8)
    assert {(s.weights, s.kernel) for s in run.of(ev.Step)} == {("stored", f"{KIND_NAMES[kind]} {kernels.status()['isa']}")}


def test_switching_live_mid_stream_keeps_the_output_and_the_next_step_follows(quant):
    e = make(quant)
    run = Run(e)
    rid = run.add(PROMPTS[1], max_new_tokens=16, temperature=0.0, ignore_eos=True)
    run.step(6)
    switched = len(run.events)
    run.events += e.apply_settings(validate(e.specs, {"weights": "dequantised"}))
    run.step(4)
    back = len(run.events)
    run.events += e.apply_settings(validate(e.specs, {"weights": "stored"}))
    run.until_idle()
    assert run.tokens(rid) == reference(quant, PROMPTS[1], 16)
    before, during, after = (run.events[:switched], run.events[switched:back], run.events[back:])
    assert {s.weights for s in before if isinstance(s, ev.Step)} == {"stored"}
    assert {s.weights for s in during if isinstance(s, ev.Step)} == {"dequantised"}
    assert {s.weights for s in after if isinstance(s, ev.Step)} == {"stored"}
    (change,) = [x for x in during if isinstance(x, ev.Settings)]
    assert change.changed == ["weights"] and change.settings["weights"] == "dequantised"
    assert change.fp32_made_s > 0                  # the fp32 copy was made for it, and timed
    (back_change,) = [x for x in after if isinstance(x, ev.Settings)]
    assert back_change.fp32_made_s is None and not e.runner.formats.fp32_resident   # switching back freed it


def test_the_fp32_copy_exists_only_while_dequantised_is_read(quant):
    """By default no layer holds an fp32 copy (the blocks alone serve); `dequantised` makes one for
    every layer and the head from the blocks, `stored` frees it again."""
    e = make(quant)
    layers = e.runner.formats.layers
    assert layers and all(layer.fp32 is None for layer in layers) and not e.runner.formats.fp32_resident
    e.apply_settings(validate(e.specs, {"weights": "dequantised"}))
    assert all(layer.fp32 is not None for layer in layers)
    e.apply_settings(validate(e.specs, {"weights": "stored"}))
    assert all(layer.fp32 is None for layer in layers)


def test_a_model_served_from_its_blocks_alone_equals_generate_on_the_dense_one(quant):
    """The model's linear weights and embedding left unmade (meta, as `load(dense=False)` leaves
    them): the engine reads only the blocks (embedding rows included) and its norms, in either
    format, and its greedy output is still `generate`'s on the dense model."""
    import copy
    import torch
    bare = copy.copy(quant)
    bare.model = copy.deepcopy(quant.model)
    with torch.no_grad():
        for name, p in list(bare.model.named_parameters()):
            if p.dim() == 2:
                parent, _, attr = name.rpartition(".")
                setattr(bare.model.get_submodule(parent), attr, torch.nn.Parameter(p.to("meta"), requires_grad=False))
    bare.dense = False
    e = make(bare)
    assert e.runner.fused is not None
    for weights in ("stored", "dequantised"):
        e.apply_settings(validate(e.specs, {"weights": weights}))
        run = Run(e)
        rid = run.add(PROMPTS[2], max_new_tokens=10, temperature=0.0, ignore_eos=True)
        run.until_idle()
        assert run.tokens(rid) == reference(quant, PROMPTS[2], 10), weights


def test_a_model_without_blocks_has_only_the_fp32_copy_and_refuses_stored(tiny):
    e = make(tiny)
    assert e.settings.now.scheduling.weights == "dequantised" and list(e.hello().weights["formats"]) == ["dequantised"]
    with pytest.raises(SettingError, match="must be one of dequantised"):
        validate(e.specs, {"weights": "stored"})


def test_a_bfloat16_model_with_blocks_reads_only_its_own_copy():
    """The kernels take fp32 activations on a CPU: a model in another dtype (or on a GPU) keeps
    its blocks unused and offers only its own weights."""
    import torch
    bundle = tiny_quant_bundle()
    bundle.model.to(torch.bfloat16)
    bundle.dtype = torch.bfloat16
    e = make(bundle)
    assert e.settings.now.scheduling.weights == "dequantised" and e.runner.fused is None
    run = Run(e)
    run.add(PROMPTS[0], max_new_tokens=4, temperature=0.0, ignore_eos=True)
    run.until_idle()
    assert {(s.weights, s.kernel) for s in run.of(ev.Step)} == {("dequantised", "torch bfloat16 on cpu")}


def test_int8_activations_are_their_own_setting_measured_against_fp32_and_counted_at_their_rate():
    """`activations: int8` (Q4_1 blocks only): offered beside fp32, off by default; choosing it
    first measures its teacher-forced agreement with fp32 on the engine's runner (the settings
    event carries it; the blocks it took are back); the steps then say int8, and the roofline
    counts the linear layers' flops at the measured int8 rate."""
    bundle = tiny_quant_bundle()
    e = make(bundle)
    assert e.specs["activations"].choices == ("fp32", "int8") and e.settings.now.scheduling.activations == "fp32"
    assert e.hello().weights["int8_path"] in ("vnni", "avx2", "portable") and e.hello().roofline["int8_peak_gops"] > 0
    used = e.blocks.used
    (change,) = e.apply_settings(validate(e.specs, {"activations": "int8"}))
    a = change.int8_agreement
    assert a["positions"] == 511 and 0 < a["top1"] <= 1 and a["max_logit_diff"] > 0 and a["seconds"] > 0
    assert e.blocks.used == used
    run = Run(e)
    rid = run.add(PROMPTS[0], max_new_tokens=6, temperature=0.0, ignore_eos=True)
    run.until_idle()
    assert len(run.tokens(rid)) == 6
    steps = run.of(ev.Step)
    assert {s.kernel for s in steps} == {f"Q4_1 {kernels.status()['isa']}, int8 activations ({kernels.int8_path()})"}
    roof, parts = e.roofline, [(0, 256, True)]
    assert roof.int8
    linear, other, nbytes = roof._cost(parts, None)
    assert roof.predict(parts)[0] == pytest.approx(max(nbytes / roof.bandwidth_bps,
                                                       linear / roof.int8_ops_per_s + other / roof.flops_per_s))
    (again,) = e.apply_settings(validate(e.specs, {"activations": "fp32"}))
    assert again.int8_agreement is None and not e.roofline.int8       # measured once a process


def test_a_model_with_q8_0_blocks_only_offers_fp32_activations():
    e = make(tiny_quant_bundle(kind=Q8_0))
    assert e.specs["activations"].choices == ("fp32",)
    with pytest.raises(SettingError, match="must be one of fp32"):
        validate(e.specs, {"activations": "int8"})
