"""One cell of ``detector_cost.py``, run in a fresh process: the setup (checkpoint,
trials, greedy decode per length) and the measurement of one detector at one length.

Imported by ``detector_cost.py``, which runs these functions in child processes
(``--setup-child``, ``--child``); see its docstring for what is measured.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

DECODE = ("locos", "wu", "dla", "attention_spatial", "headkv")
#: config fields of the random-init Qwen3 shapes (``locos_tl.models.tiny.tiny_config``)
SHAPES: dict[str, dict[str, Any]] = {
    "qwen3-8b": dict(num_hidden_layers=36, hidden_size=4096, num_attention_heads=32,
                     num_key_value_heads=8, head_dim=128, intermediate_size=12288),
    "tiny": dict(num_hidden_layers=2, hidden_size=64, num_attention_heads=4,
                 num_key_value_heads=2, head_dim=16, intermediate_size=128),
}
BOOK = "dracula_part1"
#: prompt tokens of the warm-up trial each cell runs before the measured one
WARM_TOKENS = 192


def say(*parts: Any) -> None:
    print(*parts, flush=True)  # noqa: T201 - a benchmark prints its figures


# ------------------------------------------------------------------------ setup
def build_checkpoint(path: Path, shape: str, device: str, dtype: str, text: str) -> Path:
    """A random-init Qwen3 of ``SHAPES[shape]`` with a BPE tokenizer trained on ``text``
    (unembedding rows past the tokenizer's vocabulary zeroed); reused when present."""
    if (path / "config.json").exists():
        return path
    import torch
    from transformers import AutoModelForCausalLM

    from locos_tl.models.load import resolve_dtype
    from locos_tl.models.tiny import byte_bpe_tokenizer, tiny_config

    tok = byte_bpe_tokenizer(vocab_size=4096, text=text)
    cfg = tiny_config("qwen3", 151936, max_position_embeddings=40960, rope_theta=1e6,
                      initializer_range=0.02, **SHAPES[shape])
    cfg.eos_token_id = cfg.pad_token_id = tok.eos_token_id
    cfg.bos_token_id = None
    torch.manual_seed(0)
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(cfg, dtype=resolve_dtype(dtype))
    with torch.no_grad():
        model.get_output_embeddings().weight[len(tok):] = 0
    model.save_pretrained(path)
    tok.save_pretrained(path)
    return path


def setup_child(out: Path, shape: str, device: str, dtype: str, lengths: list[int],
                new: int) -> None:
    """Write ``OUT/setup.json``: the model, the trial per length (and the warm-up
    trial), the tokens a greedy decode makes, whether it holds the answer."""
    import dataclasses
    import re

    import locos_tl as lt
    from locos_tl.data.haystack import Haystack
    from locos_tl.data.packaged import book_names, book_path, niah_probes_path
    from locos_tl.data.prompt import HaystackTooShortError
    from locos_tl.engine.answers import answer_steps
    from locos_tl.models.zoo import resolve_checkpoint

    path = out / "setup.json"
    ours = {"shape": shape, "device": device, "dtype": dtype, "new": new}
    setup = json.loads(path.read_text()) if path.exists() else {**ours, "trials": {}}
    if {k: setup[k] for k in ours} != ours:  # its CSV rows were measured on that setup
        raise SystemExit(f"{out} holds a run of {({k: setup[k] for k in ours})}, not "
                         f"{ours}: use another --out")
    if all(str(n) in setup["trials"] for n in [WARM_TOKENS, *lengths]):
        say(json.dumps({"setup": str(path)}))  # the driver's sign that it succeeded
        return
    books = [BOOK, *sorted(set(book_names()) - {BOOK})]
    texts = [book_path(b).read_text(encoding="utf-8") for b in books]
    if shape in SHAPES:
        name = str(build_checkpoint(out / f"checkpoint-{shape}", shape, device, dtype,
                                    "\n\n".join(texts)))
        ckpt, label = name, f"random {shape} shape"
    else:
        name, ckpt, label = shape, str(resolve_checkpoint(shape)), shape
    model = lt.load_model(name, device=device, dtype=dtype)
    probes = lt.load_niah_probes(niah_probes_path())[:1]

    def build(hay: Any, n: int) -> Any:
        return lt.build_niah_trials(model.tokenizer, probes, [hay], lengths=[n],
                                    depths=[50], num_examples=1, seed=0)[0]

    hay = lt.load_haystacks([book_path(BOOK)])[0]
    try:
        build(hay, max(lengths))
        hay_name = BOOK
    except HaystackTooShortError:  # too short for the longest prompt: every book
        hay_name = "+".join(books)
        hay = Haystack.from_text("\n\n".join(texts), name=hay_name)
    setup.update(model=name, checkpoint=ckpt, label=label)
    if device.startswith("cuda"):  # free beside the loaded model, as in every cell
        import torch

        setup["gpu_mb"] = torch.cuda.mem_get_info(device)[0] / 2**20
    for n in [WARM_TOKENS, *lengths]:
        if str(n) in setup["trials"]:
            continue
        trial = build(hay, n)
        res = lt.greedy_decode(model, trial.tokens, max_new_tokens=new)
        if shape in SHAPES:  # a random model: its own first word is the answer
            words = re.findall(r"[A-Za-z]{3,}", res.text) or res.text.split()
            if not words:
                raise RuntimeError(f"the {n}-token trial's greedy response is empty; "
                                   "no answer can be taken from it")
            trial = dataclasses.replace(trial, answer=words[0], trial_id="")
        setup["trials"][str(n)] = {
            "trial": trial.to_dict(), "n_new": len(res.generated), "haystack": hay_name,
            "answered": bool(answer_steps(model.tokenizer, res.generated, trial.answer))}
        say(f"setup {n}: {len(res.generated)} new tokens, answer "
            f"{'found' if setup['trials'][str(n)]['answered'] else 'NOT found'} in the "
            f"greedy response; haystack {hay_name}")
    path.write_text(json.dumps(setup))
    say(json.dumps({"setup": str(path)}))


# --------------------------------------------------------------- one measurement
class DecodeSteps:
    """Counts the decode steps of the first decode loop while active: the one-token
    calls of the model's input embedding (bridge and SDPA twin alike: they share the
    weight ``embed``) in the first run of them. Later passes over the prompt (AtP's,
    CRI's) are not counted, even where a query chunk of them is one token long."""

    def __init__(self, embed: Any) -> None:
        self.ptr, self.calls = embed.data_ptr(), []

    @property
    def steps(self) -> int:
        n = 0
        for q in self.calls:
            if q == 1:
                n += 1
            elif n:
                break
        return n

    def __enter__(self) -> DecodeSteps:
        import torch

        def pre(mod: Any, args: tuple[Any, ...]) -> None:
            if isinstance(mod, torch.nn.Embedding) and mod.weight.data_ptr() == self.ptr:
                self.calls.append(int(args[0].shape[-1]))

        self.handle = torch.nn.modules.module.register_module_forward_pre_hook(pre)
        return self

    def __exit__(self, *exc: Any) -> None:
        self.handle.remove()


def _runner(detector: str, setup: dict[str, Any]) -> Any:
    """Load the model; return ``run(trial, n_new) -> (forwards, backwards, note)``."""
    import contextlib
    import tempfile

    import torch

    import locos_tl as lt
    from locos_tl.models.load import resolve_dtype

    device, new = setup["device"], int(setup["new"])
    if detector == "hf_generate":
        from transformers import AutoModelForCausalLM

        hf = AutoModelForCausalLM.from_pretrained(
            setup["checkpoint"], attn_implementation="sdpa",
            dtype=resolve_dtype(setup["dtype"])).to(device).eval()

        def generate(trial: Any, n_new: int) -> tuple[int, int, str]:
            with torch.no_grad(), DecodeSteps(hf.get_input_embeddings().weight) as steps:
                hf.generate(torch.tensor([list(trial.tokens)], device=device),
                            max_new_tokens=n_new, min_new_tokens=n_new, do_sample=False,
                            pad_token_id=hf.config.eos_token_id)
            return 1 + steps.steps, 0, ""
        return generate
    model = lt.load_model(setup["model"], device=device, dtype=setup["dtype"])
    embed = model.original_model.get_input_embeddings().weight

    def run(trial: Any, n_new: int) -> tuple[int, int, str]:
        from locos_tl.experiments.atp import atp_heads
        from locos_tl.experiments.patching import patch_heads
        from locos_tl.experiments.qrhead import qrhead_heads

        pos = "prompt_end" if detector.endswith("_prompt_end") else "generated"
        steps, counted = DecodeSteps(embed), detector != "qrhead" and pos == "generated"
        with tempfile.TemporaryDirectory() as tmp, (
                steps if counted else contextlib.nullcontext()):
            out = Path(tmp) / "run"
            opts = dict(progress=False, out_dir=out)
            if detector in DECODE:
                lt.score_trials(model, [trial], method=detector, max_new_tokens=new, **opts)
            elif detector == "all_decode":
                lt.score_methods(model, [trial], methods=list(DECODE), max_new_tokens=new,
                                 **opts)
            elif detector == "qrhead":
                qrhead_heads(model, [trial], **opts)
            else:
                fn = patch_heads if detector.startswith("cri") else atp_heads
                fn(model, [trial], answer_position=pos, max_new_tokens=new, **opts)
            rec = json.loads((out / "trials.jsonl").read_text().splitlines()[0])
        if detector == "qrhead":  # the context's prefill, then the two question passes
            return 1 + int(rec["n_forwards"]), 0, ""
        search = 1 + steps.steps if counted else 0  # prefill + decode steps
        if detector in DECODE or detector == "all_decode":
            return search, 0, ""
        note = "" if rec["accepted"] else (
            f"trial dropped ({rec['dropped']}): only the greedy answer search ran")
        return (int(rec.get("n_forwards", 0)) + search, int(rec.get("n_backwards", 0)),
                note)
    return run


def child(setup_path: str, detector: str, n: int) -> None:
    """Load, warm up, measure ``detector`` on the ``n``-token trial; print one JSON line."""
    import torch

    from locos_tl.trials import Trial

    setup = json.loads(Path(setup_path).read_text())
    cuda = setup["device"].startswith("cuda")
    cells = {k: (Trial.from_dict(v["trial"]), int(v["n_new"]))
             for k, v in setup["trials"].items()}
    run = _runner(detector, setup)
    run(*cells[str(WARM_TOKENS)])  # kernel selection, twin build, lazy imports
    if cuda:
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated() / 2**20
    else:
        from bench_real_common import _reset_peak, _status  # beside this script

        base = _status("VmRSS")
        _reset_peak()
    t0 = time.perf_counter()
    forwards, backwards, note = run(*cells[str(n)])
    if cuda:
        torch.cuda.synchronize()
    seconds = time.perf_counter() - t0
    peak = torch.cuda.max_memory_allocated() / 2**20 if cuda else _status("VmHWM")
    if cuda:
        note = "; ".join(x for x in (torch.cuda.get_device_name(), note) if x)
    say(json.dumps({"seconds": seconds, "peak_growth_mb": peak - base, "forwards": forwards,
                    "backwards": backwards, "note": note}))
