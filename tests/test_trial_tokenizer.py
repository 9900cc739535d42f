"""Trials know their tokenizer: a fingerprint of the vocabulary and special tokens is
recorded with every trial and trials file, and runs refuse trials made by another
tokenizer before any forward pass (organism trials on a SmolLM2-like model, say)."""

from __future__ import annotations

import json
import subprocess
import sys
import warnings
from types import SimpleNamespace

import pytest
import torch

import locos_tl.trials as trials_mod
from locos_tl.errors import TrialError
from locos_tl.organisms import SMALL_ORGANISM, make_trials
from locos_tl.organisms import vocab as V
from locos_tl.tokenize import (
    TokenizerIdentity,
    model_tokenizer_identity,
    tokenizer_fingerprint,
    tokenizer_identity,
)
from locos_tl.trials import Trial, check_trials_tokenizer, load_trials, save_trials

#: the organism vocabulary's fingerprint: a change of the recipe (or of the vocabulary)
#: changes it, and every trials file written before would be refused
ORGANISM_FINGERPRINT = "cb13a3fa38997143"
UNCHECKED = "carry no tokenizer fingerprint"


@pytest.fixture(scope="module")
def organism_trials():
    return make_trials("nonliteral", 2, n_tokens=48, seed=0)


@pytest.fixture
def fresh_warnings(monkeypatch):
    """Forget which trials were already warned about (one warning per trial id)."""
    monkeypatch.setattr(trials_mod, "_UNCHECKED_WARNED", set())


@pytest.fixture
def forwards(monkeypatch):
    """Count embedding lookups: every forward pass of every model starts with one."""
    calls = []
    orig = torch.nn.Embedding.forward

    def counting(self, *args, **kwargs):
        calls.append(1)
        return orig(self, *args, **kwargs)

    monkeypatch.setattr(torch.nn.Embedding, "forward", counting)
    return calls


def _unchecked(record) -> list:
    return [w for w in record if UNCHECKED in str(w.message)]


# -- the fingerprint ------------------------------------------------------------------
def test_fingerprint_is_stable_and_names_vocabulary_and_specials(tiny_dirs):
    from transformers import AutoTokenizer

    org = V.build_tokenizer()
    assert tokenizer_fingerprint(org) == ORGANISM_FINGERPRINT
    assert V.tokenizer_identity() == TokenizerIdentity(ORGANISM_FINGERPRINT,
                                                       "locos_tl organism vocabulary")
    # the organism checkpoint's saved tokenizer is the same tokenizer
    assert tokenizer_fingerprint(AutoTokenizer.from_pretrained(SMALL_ORGANISM)) \
        == ORGANISM_FINGERPRINT
    # another process (another PYTHONHASHSEED) gives the same digits
    code = ("from locos_tl.organisms import vocab as V; "
            "from locos_tl.tokenize import tokenizer_fingerprint as f; "
            "print(f(V.build_tokenizer()))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, env={"PYTHONHASHSEED": "123", "OMP_NUM_THREADS": "1",
                                          "PATH": ""})
    assert out.stdout.strip() == ORGANISM_FINGERPRINT
    # another vocabulary, or the same vocabulary with another special token, differ
    tiny = AutoTokenizer.from_pretrained(tiny_dirs["qwen3"])
    fp_tiny = tokenizer_fingerprint(tiny)
    assert len(fp_tiny) == 16 and fp_tiny != ORGANISM_FINGERPRINT
    tiny.pad_token = tiny.convert_ids_to_tokens(5)
    assert tokenizer_fingerprint(tiny) not in (fp_tiny, ORGANISM_FINGERPRINT)
    with pytest.raises(TypeError, match="not a tokenizer"):
        tokenizer_fingerprint(object())


def test_bridge_tokenizer_has_its_checkpoint_fingerprint(organism, tiny_dirs, tiny_models):
    """The bridge reloads its tokenizer with add_bos_token=True and fills a missing BOS
    and pad with the EOS; its fingerprint is still its checkpoint's."""
    from transformers import AutoTokenizer

    assert model_tokenizer_identity(organism).fingerprint == ORGANISM_FINGERPRINT
    for arch in ("qwen3", "llama"):
        own = tokenizer_fingerprint(AutoTokenizer.from_pretrained(tiny_dirs[arch]))
        assert model_tokenizer_identity(tiny_models(arch)).fingerprint == own
    assert model_tokenizer_identity(SimpleNamespace(cfg=None)) is None  # no tokenizer


def test_a_token_added_to_the_model_tokenizer_counts(tiny_dirs):
    """A special token added to a bridge's tokenizer at run time (to mark documents) is
    encoded whole and changes the fingerprint; trials made before the change are refused
    with a message naming the added token, those made after run, as do trials made by
    the checkpoint's tokenizer given the same token."""
    from transformers import AutoTokenizer

    from locos_tl.models.load import load_model

    model = load_model(tiny_dirs["qwen3"], device="cpu")  # its own: the test changes it
    prompt, needle = "<doc> Ann sat. <doc> Yuki lives here. <doc> end", "Yuki lives here."
    before = Trial.from_text(model, prompt, needle, "Yuki")
    size = len(model.tokenizer)
    model.tokenizer.add_special_tokens({"additional_special_tokens": ["<doc>"]})
    assert tokenizer_fingerprint(model) != before.tokenizer_fingerprint
    after = Trial.from_text(model, prompt, needle, "Yuki")
    assert model.tokenizer.convert_tokens_to_ids("<doc>") == size
    assert after.tokens.count(size) == 3 and len(after.tokens) < len(before.tokens)
    assert after.tokenizer_name == f"{tiny_dirs['qwen3']} + added '<doc>'"
    plain = AutoTokenizer.from_pretrained(tiny_dirs["qwen3"])
    plain.add_special_tokens({"additional_special_tokens": ["<doc>"]})
    same = Trial.from_text(plain, prompt, needle, "Yuki")
    assert (same.tokens, same.tokenizer_fingerprint, same.tokenizer_name) == (
        after.tokens, after.tokenizer_fingerprint, after.tokenizer_name)
    check_trials_tokenizer(model, [after, same])
    with pytest.raises(TrialError) as exc:
        check_trials_tokenizer(model, [before])
    msg = str(exc.value)
    assert (f"{str(tiny_dirs['qwen3'])!r} (tokenizer fingerprint {before.tokenizer_fingerprint})"
            f", not by the model's tokenizer {after.tokenizer_name!r} (fingerprint "
            f"{after.tokenizer_fingerprint})") in msg
    # the same name, other special tokens: the message says so
    plain.pad_token = "<doc>"
    with pytest.raises(TrialError, match="both have that name, but their vocabularies or "
                                         "special tokens differ"):
        check_trials_tokenizer(SimpleNamespace(tokenizer=plain), [after])


def test_every_builder_records_its_tokenizer(organism_trials, qwen3):
    for t in organism_trials:
        assert (t.tokenizer_fingerprint, t.tokenizer_name) == (
            ORGANISM_FINGERPRINT, "locos_tl organism vocabulary")
    own = tokenizer_identity(qwen3)
    t = Trial.from_text(qwen3, "the cat sat on the mat. Where?", "cat sat", "mat")
    assert (t.tokenizer_fingerprint, t.tokenizer_name) == (own.fingerprint, own.name)
    from locos_tl.organisms import make_echo_trials

    assert {t.tokenizer_fingerprint for t in make_echo_trials(3)} == {ORGANISM_FINGERPRINT}


def test_prompt_builder_trials_record_the_tokenizer(qwen3):
    """The one place NoLiMa, NIAH and grid trials are made (locos build-trials)."""
    from locos_tl.data.haystack import Haystack
    from locos_tl.data.prompt import Insert, PromptBuilder, PromptTemplate

    hay = Haystack.from_text(" ".join(f"Sentence {i} is about the harbour." for i in
                                      range(60)), name="tiny.txt")
    t = PromptBuilder(qwen3).build(
        hay, length=80, template=PromptTemplate("Text:\n{haystack}\nQ: {question}\nA:"),
        question="Who?", needle=Insert("Later, Yuki moved to Oslo.", 40), answer="Yuki")
    assert t.n_tokens == 80
    assert (t.tokenizer_fingerprint, t.tokenizer_name) == (
        tokenizer_fingerprint(qwen3), tokenizer_identity(qwen3).name)


# -- runs refuse another tokenizer before any forward ----------------------------------
def _runs(model, trials):
    """Every run entry point, each as a zero-argument call."""
    import locos_tl as lt

    L, H = int(model.cfg.n_layers), int(model.cfg.n_heads)
    heads = {"m": [(0, 0)]}
    return {
        "score_trials": lambda: lt.score_trials(model, trials, method="locos",
                                                max_new_tokens=2, progress=False),
        "score_methods": lambda: lt.score_methods(model, trials, methods=["locos", "wu"],
                                                  max_new_tokens=2, progress=False),
        "ablation_sweep": lambda: lt.ablation_sweep(
            model, trials, heads, k=1, mode="output_zero", random=False, bottom=None,
            max_new_tokens=2, progress=False),
        "teacher_forced_sweep": lambda: lt.teacher_forced_sweep(
            model, trials, heads, k=1, mode="output_zero", random=False, bottom=None,
            progress=False),
        "patch_heads": lambda: lt.patch_heads(model, trials, max_new_tokens=2,
                                              progress=False),
        "compression_sweep": lambda: lt.compression_sweep(
            model, trials, {"m": torch.ones(L, H)}, fractions=(0.5,), include=(),
            max_new_tokens=2, progress=False),
    }


def test_organism_trials_on_a_smollm2_like_model_fail_before_any_forward(
        organism_trials, qwen3, forwards):
    """The quick start with the model swapped: organism ids on another vocabulary."""
    own = tokenizer_identity(qwen3)
    for name, run in _runs(qwen3, organism_trials).items():
        with pytest.raises(TrialError) as exc:
            run()
        msg = str(exc.value)
        assert "'locos_tl organism vocabulary'" in msg and ORGANISM_FINGERPRINT in msg, name
        assert repr(own.name) in msg and own.fingerprint in msg, name
        assert msg.startswith("2 of 2 trials (the first: trial 0, "), name
        assert f"not by the model's tokenizer {own.name!r}" in msg, name
    assert forwards == []  # no forward pass, no hook, no decoding ran


def test_other_tokenizer_trials_on_the_organism_fail_although_ids_fit(
        organism, qwen3, forwards):
    """The silent case: the tiny tokenizer's ids are all below the organism's vocabulary
    size, so the old vocabulary-range check let them through."""
    t = Trial.from_text(qwen3, "the cat sat on the mat. Where is the cat?", "cat sat", "mat")
    assert max(t.tokens) < int(organism.cfg.d_vocab)
    for name, run in _runs(organism, [t]).items():
        with pytest.raises(TrialError, match=r"not by the model's tokenizer '[^']*retrieval-2l' "
                                             r"\(fingerprint "
                                             f"{ORGANISM_FINGERPRINT}\\)") as exc:
            run()
        assert repr(t.tokenizer_name) in str(exc.value), name
        assert t.tokenizer_fingerprint in str(exc.value), name
    assert forwards == []


def test_matching_tokenizer_runs_without_a_warning(organism, organism_trials, forwards):
    import locos_tl as lt

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        hs = lt.score_trials(organism, organism_trials, method="locos", max_new_tokens=2,
                             progress=False)
    assert tuple(hs.scores.shape[-2:]) == (int(organism.cfg.n_layers),
                                           int(organism.cfg.n_heads))
    assert forwards  # it ran


# -- files and objects without a fingerprint ------------------------------------------
def test_fingerprint_round_trips_through_the_trials_file(organism_trials, tmp_path):
    path = save_trials(organism_trials, tmp_path / "t.jsonl")
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    assert {(r["tokenizer_fingerprint"], r["tokenizer_name"]) for r in rows} == {
        (ORGANISM_FINGERPRINT, "locos_tl organism vocabulary")}
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        back = load_trials(path, V.build_tokenizer())
    assert back == organism_trials
    # the fingerprint is not part of the id: older runs over the same trials resume
    plain = Trial(tokens=back[0].tokens, needle_span=back[0].needle_span,
                  answer=back[0].answer)
    assert plain.trial_id == back[0].trial_id


def test_load_trials_refuses_a_file_of_another_tokenizer(organism_trials, qwen3, tmp_path):
    path = save_trials(organism_trials, tmp_path / "t.jsonl")
    with pytest.raises(TrialError, match=r"t\.jsonl:1: this trial was tokenized by "
                                         r"'locos_tl organism vocabulary'") as exc:
        load_trials(path, qwen3)
    assert tokenizer_fingerprint(qwen3) in str(exc.value)


def test_old_file_without_fingerprint_loads_and_runs_with_one_warning(
        organism, organism_trials, tmp_path, fresh_warnings):
    import locos_tl as lt

    path = tmp_path / "old.jsonl"
    rows = [t.to_dict() for t in organism_trials]
    for r in rows:
        del r["tokenizer_fingerprint"], r["tokenizer_name"]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    with warnings.catch_warnings(record=True) as rec:
        warnings.simplefilter("always")
        old = load_trials(path, organism.tokenizer)
        hs = lt.score_trials(organism, old, method="locos", max_new_tokens=2, progress=False)
        lt.score_trials(organism, old, method="locos", max_new_tokens=2, progress=False)
    got = _unchecked(rec)
    assert len(got) == 1 and "old.jsonl: 2 of 2 trials" in str(got[0].message)
    assert [t.tokenizer_fingerprint for t in old] == ["", ""]
    assert [t.trial_id for t in old] == [t.trial_id for t in organism_trials]
    # they run as the fingerprinted trials do
    ref = lt.score_trials(organism, organism_trials, method="locos", max_new_tokens=2,
                          progress=False)
    assert hs.n_trials == ref.n_trials
    torch.testing.assert_close(hs.scores, ref.scores, equal_nan=True)
    # marking them with the tokenizer that made them makes them checked trials again
    marked = [t.with_tokenizer(organism) for t in old]
    assert marked == list(organism_trials)


def test_hand_built_trials_run_with_one_warning_and_can_be_marked(
        qwen3, fresh_warnings):
    t = Trial(tokens=[1, 2, 3, 4, 5, 6], needle_span=(1, 3), answer="x")
    with warnings.catch_warnings(record=True) as rec:
        warnings.simplefilter("always")
        check_trials_tokenizer(qwen3, [t])
        check_trials_tokenizer(qwen3, [t])  # the same trial: said once
    got = _unchecked(rec)
    assert len(got) == 1 and "1 of 1 trials" in str(got[0].message)
    assert "with_tokenizer" in str(got[0].message)
    marked = t.with_tokenizer(qwen3)
    assert marked.tokenizer_fingerprint == tokenizer_fingerprint(qwen3)
    assert marked.trial_id == t.trial_id
    with pytest.raises(TrialError, match="tokenized by"):
        check_trials_tokenizer(qwen3, [t.with_tokenizer(V.tokenizer_identity())])
    big = Trial(tokens=[1, 5000], needle_span=(0, 1), answer="x")
    with pytest.raises(TrialError, match="token id 5000 is not in the vocabulary"):
        big.with_tokenizer(qwen3)
    with pytest.raises(TrialError, match="tokenizer_fingerprint must be a str"):
        Trial(tokens=[1, 2], needle_span=(0, 1), answer="x", tokenizer_fingerprint=3)


def test_distributed_stand_in_carries_the_workers_tokenizer(organism_trials, qwen3,
                                                            tiny_dirs):
    """The distributed driver checks trials against the identity its workers report."""
    from locos_tl.runs.distributed.hosts import ModelLoader
    from locos_tl.runs.runner import check_trials_fit

    own = tokenizer_identity(qwen3)
    info = ModelLoader(str(tiny_dirs["qwen3"]), (("device", "cpu"),))().info()
    assert info["tokenizer"] == {"fingerprint": own.fingerprint, "name": own.name}
    stand_in = SimpleNamespace(cfg=SimpleNamespace(n_ctx=4096, d_vocab=10_000),
                               tokenizer_identity=own)
    with pytest.raises(TrialError, match=own.fingerprint):
        check_trials_fit(stand_in, organism_trials, 2)
    ok = SimpleNamespace(cfg=stand_in.cfg, tokenizer_identity=V.tokenizer_identity())
    check_trials_fit(ok, organism_trials, 2)
