"""``bench_real.py --diagnose``: where the memory of a scoring run goes (import cost of
TransformerLens and locos_tl, the model, the cache). Run by ``bench_real.py`` in a child
process; not a command of its own."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from bench_real_common import MODEL, WARM_TOKENS, _reset_peak, _status


def diagnose_child(setup_path: str) -> None:
    """Where the memory goes (one JSON line)."""
    import gc

    import torch
    import transformers
    from transformers import AutoModelForCausalLM, AutoTokenizer, DynamicCache

    setup = json.loads(Path(setup_path).read_text())
    ckpt = setup["checkpoint"]
    trial = setup["trials"][max(setup["trials"], key=int)]
    ids = trial["tokens"]
    out: dict[str, Any] = {"tokens": len(ids)}
    # 1. import cost on top of a loaded, warmed-up HF model and tokenizer
    hf = AutoModelForCausalLM.from_pretrained(ckpt, attn_implementation="sdpa").eval()
    AutoTokenizer.from_pretrained(ckpt)
    with torch.no_grad():
        hf.generate(torch.tensor([ids[:WARM_TOKENS]]), max_new_tokens=2, do_sample=False)
    r0 = _status("VmRSS")
    import transformer_lens  # noqa: F401

    out["import_transformer_lens_mb"] = _status("VmRSS") - r0
    r0 = _status("VmRSS")
    import locos_tl.engine.ablation  # noqa: F401
    import locos_tl.engine.decode  # noqa: F401
    import locos_tl.experiments.score  # noqa: F401

    out["import_locos_tl_mb"] = _status("VmRSS") - r0
    r0 = _status("VmRSS")
    import scipy.stats  # noqa: F401

    out["import_scipy_stats_mb"] = _status("VmRSS") - r0
    r0 = _status("VmRSS")
    import rouge_score.rouge_scorer  # noqa: F401

    out["import_rouge_score_mb"] = _status("VmRSS") - r0
    # 2. the HF prefill of the prompt (SDPA, logits of the last position only)
    cache = DynamicCache(config=hf.config)
    _reset_peak()
    r0 = _status("VmRSS")
    with torch.no_grad():
        logits = hf(torch.tensor([ids[:-1]]), past_key_values=cache, use_cache=True,
                    logits_to_keep=1).logits
    out["hf_prefill_peak_mb"] = _status("VmHWM") - r0
    out["kv_cache_mb"] = sum(t.nbytes for lay in cache.layers for t in (lay.keys, lay.values)
                             ) / 2**20
    del cache, logits, hf
    gc.collect()
    # 3. the bridge: shared tensors, tokenizer loads, twins, prefill, scoring
    import locos_tl as lt
    from locos_tl.engine.forward import prefill
    from locos_tl.engine.twin import twin_info

    loads = []
    orig = transformers.AutoTokenizer.from_pretrained.__func__

    def counted(cls: Any, *a: Any, **k: Any) -> Any:
        loads.append(1)
        return orig(cls, *a, **k)

    transformers.AutoTokenizer.from_pretrained = classmethod(counted)  # type: ignore[assignment]
    model = lt.load_model(MODEL, device="cpu")
    out["tokenizer_loads_in_load_model"] = len(loads)
    base_hf = model.original_model
    for p in base_hf.parameters():
        p.data.sum()
    ptrs = {p.data_ptr() for p in base_hf.parameters()}
    out["lm_head_tied_to_embedding"] = (base_hf.lm_head.weight.data_ptr()
                                        == base_hf.model.embed_tokens.weight.data_ptr())
    out["W_U_is_lm_head"] = model.W_U.data_ptr() == base_hf.lm_head.weight.data_ptr()
    out["W_O_are_views"] = all(model.blocks[l].attn.W_O.data_ptr() in ptrs
                               for l in range(int(model.cfg.n_layers)))
    r0 = _status("VmRSS")
    twins = [twin_info(model, k).twin for k in ("sdpa", "eager")]
    out["twins_mb"] = _status("VmRSS") - r0
    out["twins_share_every_tensor"] = all(p.data_ptr() in ptrs for t in twins
                                          for p in t.parameters())
    lt.score_trials(model, [lt.Trial(tokens=ids[:WARM_TOKENS], needle_span=(16, 24),
                                     answer=trial["answer"])], max_new_tokens=2,
                    progress=False)
    gc.collect()
    _reset_peak()
    r0 = _status("VmRSS")
    cache = prefill(model, torch.tensor([ids[:-1]]))
    out["locos_prefill_peak_mb"] = _status("VmHWM") - r0
    del cache
    gc.collect()
    loads.clear()
    r0 = _status("VmRSS")
    _reset_peak()
    lt.score_trials(model, [lt.Trial(tokens=ids, needle_span=tuple(trial["needle_span"]),
                                     answer=trial["answer"])],
                    max_new_tokens=int(setup["max_new"]), progress=False)
    out["score_call_peak_mb"] = _status("VmHWM") - r0
    out["tokenizer_loads_in_score"] = len(loads)
    gc.collect()
    big = [o for o in gc.get_objects() if isinstance(o, torch.Tensor)
           and not isinstance(o, torch.nn.Parameter) and o.nbytes > 2**20]
    out["tensors_over_1mb_alive_after_score"] = len(big)
    out["caches_alive_after_score"] = sum(isinstance(o, DynamicCache) for o in gc.get_objects())
    print(json.dumps(out))
