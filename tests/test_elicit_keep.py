"""Keeping the model while eliciting: the KL term against a brute-force KL, the
non-retrieval prompts disjoint from the specificity controls, validation entries spread
over link kinds, full-MLP training leaving attention, norms and embeddings bit for bit,
early stopping on the validation score with the best state kept, and resumption with the
KL term on."""

from __future__ import annotations

import copy
import dataclasses
import json

import pytest
import torch

pytest.importorskip("peft", reason="the elicit extra is not installed")

from elicit_helpers import hf_model as _hf  # noqa: E402
from elicit_helpers import name_trials as _trials  # noqa: E402

from locos_tl.data import load_needle_set  # noqa: E402
from locos_tl.data.controls import arithmetic_examples, parametric_examples  # noqa: E402
from locos_tl.errors import DataFormatError, LocosError  # noqa: E402
from locos_tl.organisms import elicit as el  # noqa: E402
from locos_tl.organisms import elicit_keep as ek  # noqa: E402
from locos_tl.organisms.elicit_data import split_entries  # noqa: E402


def _keep(tiny_dirs, weight=1.0):
    base, tok = _hf(tiny_dirs)
    base.eval().requires_grad_(False)
    text = "The river ran past the mill and the old bridge towards the sea. " * 40
    books = ek.book_tokens(tok, [text])
    prompts = [tok(f"Question: what is {a} + {a}?\nAnswer: {2 * a}")["input_ids"]
               for a in range(10, 26)]
    return ek.KeepData(base=base, books=books, prompts=prompts, window=24, weight=weight)


def test_kl_equals_brute_force_and_vanishes_on_the_base(tiny_dirs):
    model, tok = _hf(tiny_dirs)
    keep = _keep(tiny_dirs)
    ids = keep.train_window(3)
    assert len(ids) == 24
    assert ek.kl_to_base(model, keep.base, ids).item() == 0.0  # same weights, same kernels
    with torch.no_grad():
        for n, p in model.named_parameters():
            if ".mlp." in n:
                p.add_(torch.randn(p.shape, generator=torch.Generator().manual_seed(len(n)))
                       * 0.05)
        x = torch.tensor([ids])
        p = model(x).logits[0].double().softmax(-1)
        q = keep.base(x).logits[0].double().softmax(-1)
        want = sum(float((q[t] * (q[t].log() - p[t].log())).sum()) for t in range(len(ids)))
    got = ek.kl_to_base(model, keep.base, ids).item()
    assert got > 0
    assert got == pytest.approx(want / len(ids), rel=1e-4)  # float32 log-softmax vs float64


def test_adapter_off_is_the_frozen_base_bit_for_bit(tiny_dirs):
    """The LoRA run's KL reference is the model itself with its adapters turned off: the
    logits, greedy generations and KL terms equal a frozen copy's, and each call leaves
    the adapters on and the training mode as it was."""
    base, tok = _hf(tiny_dirs)
    base.eval()
    model = el.add_mlp_lora(_hf(tiny_dirs)[0], el.ElicitConfig(rank=2, alpha=4))
    with torch.no_grad():
        for n, p in model.named_parameters():
            if "lora_B" in n:
                p.normal_(0, 0.5, generator=torch.Generator().manual_seed(len(n)))
    model.train()
    ref = ek.AdapterOff(model)
    ids = tok("The river ran past the mill and the old bridge.")["input_ids"]
    x = torch.tensor([ids])
    with torch.no_grad():
        got, want = ref(input_ids=x).logits, base(input_ids=x).logits
        adapted = model(input_ids=x).logits
    assert torch.equal(got, want)
    assert (adapted - want).abs().max() > 1e-3  # the adapters are on again after the call
    assert model.training
    gen = dict(attention_mask=torch.ones_like(x), max_new_tokens=6, do_sample=False,
               pad_token_id=tok.eos_token_id)
    assert torch.equal(ref.generate(input_ids=x, **gen), base.generate(input_ids=x, **gen))
    kl = ek.kl_to_base(model, ref, ids)
    assert kl.item() > 0 and kl.item() == ek.kl_to_base(model, base, ids).item()


def test_keep_prompts_are_not_control_questions():
    qs = ek.keep_questions(seed=0)
    assert len(qs) == len(set(qs)) == len(ek.KEEP_FACTS) + 32 + len(ek.KEEP_CHAT)
    controls = {e.question for e in parametric_examples()}
    controls |= {e.question for e in arithmetic_examples(200, seed=0)}
    assert not set(qs) & controls
    sums = [q for q in qs if q.startswith("What is") and q[8].isdigit()]
    assert len(sums) == 32
    for q in sums:  # two digits each side: never one of the 1-digit controls
        a, _, b = q.removeprefix("What is ").removesuffix("?").split()
        assert 10 <= int(a) <= 99 and 10 <= int(b) <= 99
    assert ek.keep_questions(seed=0) == qs and ek.keep_questions(seed=1) != qs


def test_held_out_windows_and_prompts_never_train(tiny_dirs):
    keep = _keep(tiny_dirs)
    (book,) = keep.books
    cut = int(len(book) * 0.9)
    held = {tuple(w) for w in keep.val_windows()}
    assert held and all(list(w) == book[cut + i * 24: cut + (i + 1) * 24]
                        for i, w in enumerate(keep.val_windows()))
    for step in range(200):
        w = keep.train_window(step)
        start = next(i for i in range(len(book)) if book[i:i + 24] == w)
        assert start + 24 <= cut
        assert keep.train_prompt(step) not in keep.val_prompts()
    assert keep.train_window(7) == keep.train_window(7)  # seeded by step


def test_validation_books_replace_the_training_tails(tiny_dirs):
    keep = _keep(tiny_dirs)
    keep.val_books = [list(range(3, 3 + 24 * 40))]  # 40 windows of 24 tokens
    wins = keep.val_windows(n=8)
    assert len(wins) == 16 and all(len(w) == 24 for w in wins)
    starts = [w[0] - 3 for w in wins]
    assert starts == [24 * 2 * i for i in range(16)]  # every other window, from the start
    keep.val_books = [list(range(24 * 3))]  # shorter than 2 n windows: all of them
    assert [w[0] for w in keep.val_windows(n=8)] == [0, 24, 48]
    model, _ = _hf(tiny_dirs)
    row = ek.keep_validation(model, keep)
    assert row["ppl_ratio"] == 1.0 and row["kl_text"] == 0.0  # the base itself


def test_bos_starts_every_book_window(tiny_dirs):
    keep = _keep(tiny_dirs)
    plain = (keep.train_window(5), keep.val_windows())
    keep.bos = 7
    assert keep.train_window(5) == [7, *plain[0]]
    assert keep.val_windows() == [[7, *w] for w in plain[1]]
    keep.val_books = [list(range(100, 200))]
    assert all(w[0] == 7 and len(w) == 25 for w in keep.val_windows())


def test_leading_bos_is_the_token_put_before_text():
    class Tok:
        def __init__(self, bos, adds):
            self.bos_token_id, self.adds = bos, adds

        def __call__(self, text):
            return {"input_ids": [self.bos_token_id] * self.adds + [40]}

    assert ek.leading_bos(Tok(2, True)) == 2  # Gemma: <bos> starts every text
    assert ek.leading_bos(Tok(1, False)) is None  # SmolLM2: <|im_start|> is a chat marker
    assert ek.leading_bos(Tok(None, False)) is None

def test_validation_entries_spread_over_kinds():
    entries = load_needle_set("hop_train")
    train, val = split_entries(entries, 11, by="kind")
    assert len(train) == len(entries) - 11 >= 150
    assert len({e.reasoning_type for e in val}) == 11
    assert not {e.id for e in train} & {e.id for e in val}
    assert {e.reasoning_type for e in train} == {e.reasoning_type for e in entries}
    last_train, last_val = split_entries(entries, 11, by="last")
    assert len({e.reasoning_type for e in last_val}) == 1  # why "kind" is the default
    with pytest.raises(DataFormatError, match="'last' or 'kind'"):
        split_entries(entries, 11, by="random")


def test_validation_set_of_new_kinds_replaces_the_held_out_entries(tmp_path):
    from locos_tl.organisms.elicit_data import run_entries

    held_train, held_val = run_entries("hop_train", 11)
    train, val = run_entries("hop_train", 11, val_needle_set="hop_val")
    assert [e.id for e in train] == [e.id for e in held_train]  # training unchanged
    assert [e.id for e in val] == sorted(e.id for e in load_needle_set("hop_val"))
    assert len(val) == 24 and len({e.reasoning_type for e in val}) == 4
    assert not {e.reasoning_type for e in val} & {e.reasoning_type for e in train}
    assert {e.id for e in held_val} != {e.id for e in val}
    # a validation set of training kinds is refused, naming the kinds
    with pytest.raises(DataFormatError, match="shares link kinds .*city_country"):
        run_entries("hop_train", 11, val_needle_set="hop_detect")


def test_a_checkpoint_from_before_a_new_field_still_resumes():
    cfg = el.ElicitConfig(kl_weight=3.0, val_books=("mohicans_part2",))
    saved = cfg.to_dict()
    old = {k: v for k, v in saved.items() if k != "val_needle_set"}  # predates the field
    assert el.same_config(saved, cfg) and el.same_config(old, cfg)
    assert not el.same_config(old, dataclasses.replace(cfg, val_needle_set="hop_val"))
    assert not el.same_config({**old, "kl_weight": 1.0}, cfg)


def test_a_checkpoint_from_before_text_bos_resumes_only_without_bos():
    """A run recorded before ``text_bos`` trained without BOS windows: resumed with the
    current default (BOS) it is refused, with ``text_bos=False`` it goes on."""
    cfg = el.ElicitConfig(text_bos=False)
    old = {k: v for k, v in cfg.to_dict().items() if k != "text_bos"}
    assert el.same_config(old, cfg)
    assert not el.same_config(old, el.ElicitConfig())
    assert el.same_config(el.ElicitConfig().to_dict(), el.ElicitConfig())


def test_full_mlp_training_keeps_attention_norms_embeddings(tiny_dirs, tmp_path):
    model, tok = _hf(tiny_dirs)
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    cfg = el.ElicitConfig(trainable="mlp", steps=3, warmup=1, lr=1e-2, save_every=1,
                          val_every=100, bf16_autocast=False, patience=0)
    model = el.prepare_trainable(model, cfg)
    el.train_adapter(model, tok, _trials(tok), {}, cfg, tmp_path, keep=_keep(tiny_dirs),
                     log=lambda m: None)
    moved = 0
    for n, p in model.named_parameters():
        if ".mlp." in n:
            moved += not torch.equal(p, before[n])
        else:
            assert torch.equal(p, before[n]), n
    assert moved == 3 * 2
    with pytest.raises(el.LocosError, match="'lora' or 'mlp'"):
        el.prepare_trainable(model, el.ElicitConfig(trainable="attention"))


def test_early_stopping_keeps_the_best_validation_state(tiny_dirs, tmp_path, monkeypatch):
    """Validation scores 0.5, 0.25, then 0.75 with perplexity over the bound (not
    eligible): with patience 2 the run stops after step 3 and the model ends in the
    state of step 1."""
    cfg = el.ElicitConfig(steps=8, warmup=1, rank=2, alpha=4, save_every=1, val_every=1,
                          bf16_autocast=False, lr=1e-2, patience=2)
    rows = iter([{"onehop_target": 0.5, "onehop_distractor": 0.0},
                 {"onehop_target": 0.5, "onehop_distractor": 0.25},
                 {"onehop_target": 0.75, "onehop_distractor": 0.0, "ppl_ratio": 1.2},
                 {"onehop_target": 0.25, "onehop_distractor": 0.0}])
    monkeypatch.setattr(el, "validate", lambda *a, **k: dict(next(rows)))
    model, tok = _hf(tiny_dirs)
    model = el.add_mlp_lora(model, cfg)
    states = []
    real = el.trained_state

    def record(m, c):
        s = real(m, c)
        states.append(copy.deepcopy(s))
        return s

    monkeypatch.setattr(el, "trained_state", record)
    out = el.train_adapter(model, tok, _trials(tok, 8), {"onehop": []}, cfg, tmp_path,
                           log=lambda m: None)
    assert out["best_step"] == 1 and out["stopped_at"] == 3
    assert out["validation"] == {"onehop_target": 0.5, "onehop_distractor": 0.0}
    best = torch.load(tmp_path / "best.pt", weights_only=False)
    final = real(model, cfg)
    for k in best:
        assert torch.equal(final[k], best[k]), k
    assert not all(torch.equal(final[k], states[-1][k]) for k in final)  # it rolled back
    steps = [json.loads(x)["step"] for x in (tmp_path / "curve.jsonl").open()]
    assert steps == [1, 2, 3]


def test_validation_score_rules():
    cfg = el.ElicitConfig()
    assert el.validation_score({"onehop_target": 0.7, "onehop_distractor": 0.1}, cfg) \
        == pytest.approx(0.6)
    assert el.validation_score({"onehop_target": 0.7, "ppl_ratio": 1.06}, cfg) is None
    assert el.validation_score({"direct_target": 1.0}, cfg) is None


def test_resumed_run_with_kl_equals_uninterrupted(tiny_dirs, tmp_path, monkeypatch):
    cfg = el.ElicitConfig(steps=4, warmup=1, rank=2, alpha=4, save_every=1, val_every=100,
                          bf16_autocast=False, lr=1e-2, patience=0)

    def run(out, stop_after=None):
        model, tok = _hf(tiny_dirs)
        model = el.add_mlp_lora(model, cfg)
        calls = {"n": 0}
        real = el._keep_loss

        def limited(*a, **k):
            calls["n"] += 1
            if stop_after is not None and calls["n"] > stop_after:
                raise KeyboardInterrupt
            return real(*a, **k)

        monkeypatch.setattr(el, "_keep_loss", limited)
        try:
            el.train_adapter(model, tok, _trials(tok), {}, cfg, out, keep=_keep(tiny_dirs),
                             log=lambda m: None)
        finally:
            monkeypatch.setattr(el, "_keep_loss", real)
        return el.trained_state(model, cfg)

    whole = run(tmp_path / "a")
    with pytest.raises(KeyboardInterrupt):
        run(tmp_path / "b", stop_after=2)
    resumed = run(tmp_path / "b")
    for k in whole:
        assert torch.equal(whole[k], resumed[k]), k
    rows = [json.loads(x) for x in (tmp_path / "a" / "curve.jsonl").open()]
    assert all(r["kl_text_train"] > 0 and r["kl_prompts_train"] >= 0 for r in rows[1:])


def test_cast_adapter_rounds_once_and_merges_the_rounded_weights(tiny_dirs, tmp_path):
    from safetensors.torch import load_file

    from locos_tl.models.elicited import cast_adapter, merged_model

    model, _ = _hf(tiny_dirs)
    wrapped = el.add_mlp_lora(model, el.ElicitConfig(rank=2, alpha=4))
    with torch.no_grad():
        for n, p in wrapped.named_parameters():
            if "lora_B" in n:
                p.normal_(0, 0.5, generator=torch.Generator().manual_seed(len(n)))
    wrapped.save_pretrained(tmp_path / "adapter")
    before = load_file(tmp_path / "adapter" / "adapter_model.safetensors")
    cast_adapter(tmp_path / "adapter")
    after = load_file(tmp_path / "adapter" / "adapter_model.safetensors")
    assert before.keys() == after.keys()
    for k, v in after.items():
        assert v.dtype == torch.bfloat16 and torch.equal(v, before[k].to(torch.bfloat16)), k
    merged = dict(merged_model(tmp_path / "adapter", tiny_dirs["llama"]).named_parameters())
    for k, v in after.items():  # merged weight = base + (alpha / r) B A of the rounded A, B
        if ".lora_A." not in k:
            continue
        stem = k.removeprefix("base_model.model.").replace(".lora_A.weight", "")
        b = after[k.replace("lora_A", "lora_B")].double()
        base = dict(_hf(tiny_dirs)[0].named_parameters())[f"{stem}.weight"].double()
        want = base + 2.0 * (b @ v.double())
        torch.testing.assert_close(merged[f"{stem}.weight"].double(), want, rtol=0,
                                   atol=1e-6)
    with pytest.raises(el.LocosError, match="no adapter weights"):
        cast_adapter(tmp_path / "nothing")


def test_elicit_runs_end_to_end_and_validates_on_new_kinds(tiny_dirs, tmp_path,
                                                           monkeypatch):
    """``elicit`` on the tiny Llama (completion form, KL term on, a validation book,
    ``hop_val`` validating): the adapter, the record of what validated, a validation row
    and the KL of an adapter that has barely moved; a rerun with another validation set
    is refused rather than mixed into the run."""
    cfg = el.ElicitConfig(base=str(tiny_dirs["llama"]), steps=2, warmup=1, rank=2, alpha=4,
                          lengths=(480,), val_length=480, val_trials=2, val_every=2,
                          kl_window=32, save_every=1, bf16_autocast=False, patience=0,
                          val_needle_set="hop_val", val_books=("mohicans_part2",))
    out = tmp_path / "run"
    from transformers import AutoModelForCausalLM

    loads = []
    real = AutoModelForCausalLM.from_pretrained.__func__
    monkeypatch.setattr(AutoModelForCausalLM, "from_pretrained", classmethod(
        lambda cls, *a, **k: loads.append(a[0]) or real(cls, *a, **k)))
    adapter = el.elicit(cfg, out, log=lambda m: None)
    assert len(loads) == 1  # the KL term reads the base through the LoRA model, no copy
    monkeypatch.undo()
    assert (adapter / "adapter_model.safetensors").is_file()
    record = json.loads((out / "elicit.json").read_text())
    assert record["validation_entries"] == sorted(e.id for e in load_needle_set("hop_val"))
    assert record["config"]["val_needle_set"] == "hop_val"
    assert record["config"]["template"] == "completion"  # the tiny tokenizer has no chat
    rows = [json.loads(x) for x in (out / "curve.jsonl").read_text().splitlines()]
    val = [r for r in rows if "onehop_target" in r]
    assert [r["step"] for r in val] == [2]
    assert 0 <= val[0]["kl_text"] < 1e-3 and abs(val[0]["ppl_ratio"] - 1) < 1e-2
    with pytest.raises(LocosError, match="another configuration"):
        el.elicit(dataclasses.replace(cfg, val_needle_set=""), out, log=lambda m: None)
