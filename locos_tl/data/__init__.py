"""Retrieval-trial data: haystacks, NoLiMa needle sets, NIAH probes, grids, hub loaders."""

from locos_tl.data.controls import (
    build_arithmetic_trials,
    build_control_trials,
    build_parametric_trials,
)
from locos_tl.data.grid import (
    GridCell,
    linspace_depths,
    linspace_lengths,
    parse_depths,
    parse_lengths,
    stratified_sample,
)
from locos_tl.data.haystack import Haystack, load_haystack, load_haystacks, sentence_starts
from locos_tl.data.hub import (
    HubUnavailableError,
    fetch_nolima,
    load_babilong,
    load_musique,
    load_nolima,
    load_parametric_controls,
    load_tokenizer,
)
from locos_tl.data.niah import NiahProbe, build_niah_trials, load_niah_probes, parse_niah_probe
from locos_tl.data.nolima import (
    NoLiMaEntry,
    NoLiMaItem,
    NoLiMaTest,
    choose_characters,
    expand_needle_set,
    load_needle_set,
    nolima_seed,
    parse_needle_set,
)
from locos_tl.data.nolima_trials import build_nolima_trials, nolima_cells
from locos_tl.data.prompt import HaystackTooShortError, Insert, PromptBuilder, PromptTemplate

__all__ = [
    "GridCell",
    "Haystack",
    "HaystackTooShortError",
    "HubUnavailableError",
    "Insert",
    "NiahProbe",
    "NoLiMaEntry",
    "NoLiMaItem",
    "NoLiMaTest",
    "PromptBuilder",
    "PromptTemplate",
    "build_arithmetic_trials",
    "build_control_trials",
    "build_niah_trials",
    "build_nolima_trials",
    "build_parametric_trials",
    "choose_characters",
    "expand_needle_set",
    "fetch_nolima",
    "linspace_depths",
    "linspace_lengths",
    "load_babilong",
    "load_haystack",
    "load_haystacks",
    "load_musique",
    "load_needle_set",
    "load_niah_probes",
    "load_nolima",
    "load_parametric_controls",
    "load_tokenizer",
    "nolima_cells",
    "nolima_seed",
    "parse_depths",
    "parse_lengths",
    "parse_needle_set",
    "parse_niah_probe",
    "sentence_starts",
    "stratified_sample",
]
