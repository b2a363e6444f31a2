"""The research topics the offline teacher knows, and how to recognise them again.

Each entry names its task family (which decides metric, dataset and code shape downstream) and the
search queries a teacher would type to find its data. Topics come back from the pipeline re-cased,
pluralised, hyphenated or reordered, so `lookup` compares order-free, singularised token keys.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Literal

from gymforge.core.dedup import words

Family = Literal[
    "tabular_classification",
    "tabular_regression",
    "time_series_forecasting",
    "model_submission",
    "game_strategy",
    "unavailable",
]
FAMILIES: tuple[Family, ...] = (
    "tabular_classification",
    "tabular_regression",
    "time_series_forecasting",
    "model_submission",
    "game_strategy",
    "unavailable",
)


@dataclass(frozen=True)
class VocabEntry:
    text: str
    family: Family
    queries: list[str]
    # A plausible hub id that does not exist: proposing it makes the pipeline discard the topic.
    phantom_dataset: str | None = None


def _entries(family: Family, rows: list[tuple[str, ...]]) -> list[VocabEntry]:
    return [VocabEntry(text, family, list(queries)) for text, *queries in rows]


def _unavailable(rows: list[tuple[str, str, str]]) -> list[VocabEntry]:
    return [VocabEntry(text, "unavailable", [query], phantom) for text, query, phantom in rows]


# The first query names the dataset the way a hub search finds it; the second is a broader fallback.
VOCABULARY: tuple[VocabEntry, ...] = tuple(
    _entries(
        "tabular_classification",
        [
            ("Iris species classification from flower measurements", "iris", "flower classification"),
            ("Semi-supervised iris classification with few labels", "iris", "botany"),
            ("Nearest-neighbour methods for iris species recognition", "iris", "flowers"),
            ("Wine cultivar classification from chemical analysis", "wine", "chemistry classification"),
            ("Support vector machines for wine recognition", "wine", "chemistry"),
            ("Feature selection for wine cultivar prediction", "wine", "food classification"),
            ("Breast tumour malignancy diagnosis from cell nuclei", "breast cancer", "medical classification"),
            ("Cost-sensitive breast cancer screening classifier", "breast cancer", "diagnosis"),
            ("Probability calibration for tumour malignancy prediction", "breast cancer", "medical"),
            ("Interpretable rule models for cancer diagnosis", "breast cancer", "diagnosis"),
            ("Handwritten digit recognition from 8x8 pixel grids", "digits", "handwriting"),
            ("Dimensionality reduction before digit classification", "digits", "ocr"),
            ("Ensemble methods for handwritten digit classification", "digits", "handwriting"),
            ("Robustness of digit classifiers to pixel noise", "digits", "image classification"),
            ("Penguin species identification from body measurements", "penguins", "species classification"),
            ("Gradient boosting for penguin species classification", "penguins", "ecology"),
            ("Missing value handling in penguin species classification", "penguins", "animals"),
            ("Predicting grade improvement under a new teaching method", "spector", "education"),
            ("Logistic regression versus trees for grade improvement", "spector", "education logit"),
            ("Presidential vote choice prediction from voter attitudes", "anes96", "elections survey"),
            ("Vote prediction from party identification and ideology", "anes96", "politics"),
            ("Uncertainty estimates for voter choice classification", "anes96", "elections"),
            ("Travel mode choice prediction for intercity trips", "modechoice", "travel mode"),
            ("Discrete choice modelling of travel alternatives", "modechoice", "transportation"),
        ],
    )
    + _entries(
        "tabular_regression",
        [
            ("Diabetes disease progression regression from baseline measurements", "diabetes", "medical regression"),
            ("Robust regression for diabetes progression with outliers", "diabetes", "regression"),
            ("Sparse linear models for disease progression", "diabetes", "health"),
            ("Body weight prediction from exercise performance", "linnerud", "fitness"),
            ("Ammonia plant stack loss regression", "stackloss", "industrial"),
            ("Outlier-resistant regression of nitric acid plant losses", "stackloss", "chemistry regression"),
            ("Total employment regression on macroeconomic indicators", "longley", "macroeconomics"),
            ("Regression under severe collinearity in economic data", "longley", "economics regression"),
            ("Credit card expenditure prediction from income and age", "ccard", "credit card"),
            ("Engel curve estimation of household food spending", "engel", "household consumption"),
            ("Heteroscedastic regression of food expenditure", "engel", "economics"),
            ("Corporate investment modelling from firm value", "grunfeld", "investment"),
            ("Panel data regression of firm investment", "grunfeld", "panel data"),
            ("Extramarital affair intensity from marriage survey answers", "fair", "marriage survey"),
            ("Medical visit counts under health insurance plans", "randhie", "health insurance"),
            ("Count regression of doctor visits", "randhie", "count data"),
            ("State murder rate modelling from socioeconomic indicators", "statecrime", "crime"),
            ("Gradient boosting versus linear models for crime rates", "statecrime", "social science"),
            ("Heart transplant survival time regression", "heart", "survival"),
            ("Fuel efficiency regression from car specifications", "cars", "fuel efficiency"),
            ("Barley yield prediction across sites and varieties", "barley", "agriculture"),
            ("Crop yield modelling from field trial records", "barley", "crops"),
        ],
    )
    + _entries(
        "time_series_forecasting",
        [
            ("Atmospheric CO2 concentration forecasting", "co2", "climate"),
            ("Seasonal decomposition for Mauna Loa CO2 forecasting", "co2", "atmosphere"),
            ("Long-horizon forecasting of greenhouse gas trends", "co2", "environment"),
            ("Exponential smoothing for atmospheric CO2", "co2", "forecasting"),
            ("Yearly sunspot activity forecasting", "sunspots", "solar"),
            ("Solar cycle modelling for sunspot prediction", "sunspots", "astronomy"),
            ("Autoregressive models for sunspot numbers", "sunspots", "forecasting"),
            ("Neural versus statistical forecasting of sunspots", "sunspots", "yearly"),
            ("Nile river annual flow forecasting", "nile", "river"),
            ("Changepoint-aware forecasting of river discharge", "nile", "hydrology"),
            ("US real GDP forecasting from quarterly data", "macrodata", "gdp"),
            ("Multivariate macroeconomic forecasting with vector autoregression", "macrodata", "macroeconomics"),
            ("Gradient boosting with lag features for GDP forecasting", "macrodata", "quarterly"),
            ("Daily maximum temperature forecasting for Seattle", "seattle weather", "weather"),
            ("Short-term temperature forecasting from weather history", "seattle weather", "daily"),
            ("Weather-driven temperature forecasting with lagged features", "seattle weather", "climate"),
            ("Monthly US nonfarm payroll forecasting", "us employment", "employment"),
            ("Labour market forecasting across industry sectors", "us employment", "labor"),
            ("Employment forecasting after the 2008 recession", "us employment", "economics"),
            ("Quarterly economic output forecasting with exogenous indicators", "macrodata", "economics"),
        ],
    )
    + _entries(
        "model_submission",
        [
            ("Train and submit a wine cultivar classifier", "wine"),
            ("Train and submit a compact MLP for digit recognition", "digits"),
            ("Train and submit a penguin species classifier", "penguins"),
            ("Train and submit a diabetes progression regressor", "diabetes"),
            ("Train and submit a calibrated tumour malignancy model", "breast cancer"),
            ("Train and submit an iris classifier robust to noise", "iris"),
            ("Train and submit a fuel efficiency regressor", "cars"),
            ("Train and submit a presidential vote choice model", "anes96"),
            ("Train and submit a travel mode choice model", "modechoice"),
            ("Train and submit a stack loss regressor", "stackloss"),
            ("Train and submit a state murder rate regressor", "statecrime"),
            ("Train and submit a barley yield regressor", "barley"),
            ("Train and submit a doctor visit count regressor", "randhie"),
            ("Train and submit a credit card spending regressor", "ccard"),
        ],
    )
    + _entries(
        "game_strategy",
        [
            ("Strategy for the iterated stag hunt against adaptive opponents",),
            ("Hawk-dove strategy in repeated encounters",),
            ("Repeated matching pennies against pattern-seeking opponents",),
            ("Rock-paper-scissors bot exploiting biased opponents",),
            ("Bidding strategy for repeated first-price sealed-bid auctions",),
            ("Reserve price learning in repeated second-price auctions",),
            ("Contribution strategy in the repeated public goods game",),
            ("Ultimatum game offers against heterogeneous responders",),
            ("Quantity setting in a repeated Cournot duopoly",),
            ("Price setting in repeated Bertrand competition",),
            ("Investment strategy in the repeated trust game",),
            ("Crowd avoidance in the El Farol bar minority game",),
            ("Exploration strategy design for Bernoulli multi-armed bandits",),
            ("Online bin packing heuristic design",),
            ("Construction heuristic for random travelling salesman instances",),
            ("Greedy knapsack heuristics under a time budget",),
            ("Job shop scheduling heuristic minimising makespan",),
            ("Optimal stopping rule for the secretary problem",),
        ],
    )
    + _unavailable(
        [
            ("Human action recognition in short video clips", "video action recognition", "kinetiq-lab/clip-actions-mini"),
            ("Protein secondary structure prediction from sequence", "protein structure", "proteomix/ss8-casp-folds"),
            ("Keyword spotting in spoken commands", "speech commands", "voxlab/spoken-keyword-commands-35"),
            ("Speaker identification from raw waveforms", "speaker identification", "voxlab/speaker-verif-16k"),
            ("Low-resource machine translation for Yoruba", "yoruba translation", "afrotext/yoruba-english-parallel-v2"),
            ("Abstractive summarisation of news articles", "news summarization", "newsroom-nlp/abstractive-briefs"),
            ("Land cover segmentation of satellite imagery", "satellite land cover", "orbital-eo/landcover-tiles-10m"),
            ("Chest X-ray pathology detection", "chest x-ray", "radiolab/cxr-findings-14k"),
            ("Point cloud object classification", "point cloud", "pointnetics/shapes-3d-40"),
            ("Music genre classification from audio clips", "music genre", "sonicset/genre-clips-30s"),
            ("Code generation from Python docstrings", "code generation", "codegenix/docstring2code-py"),
            ("Molecular solubility prediction from SMILES strings", "molecule solubility", "chemformer/aqsol-smiles-curated"),
            ("Pedestrian trajectory prediction for autonomous driving", "pedestrian trajectories", "urbanmotion/pedestrian-tracks-eth"),
            ("Sign language recognition from video", "sign language", "signbank/isolated-signs-video"),
            ("Handwritten text recognition in historical manuscripts", "historical manuscripts", "archivum/medieval-htr-pages"),
            ("Named entity recognition in clinical notes", "clinical ner", "clinotes/ner-ward-summaries"),
            ("Sentiment analysis of product reviews", "product reviews sentiment", "reviewpulse/product-sentiment-5class"),
            ("Open-domain question answering over encyclopedia passages", "open domain qa", "openqa-lab/encyclopedia-passages-qa"),
            ("Nucleus segmentation in fluorescence microscopy", "microscopy segmentation", "cellscope/fluoro-masks-2d"),
            ("Emotion recognition from speech recordings", "speech emotion", "voxlab/emotional-speech-8way"),
            ("Genomic variant pathogenicity prediction", "genomic variants", "genomix/clinvar-variant-lite"),
            ("Precipitation nowcasting from radar image sequences", "radar nowcasting", "stormcast/radar-frames-5min"),
        ]
    )
)

# Suffixes the topic sampler appends once the plain vocabulary runs out; `lookup` strips them again.
QUALIFIERS: dict[Family, tuple[str, ...]] = {
    "tabular_classification": ("with limited training data", "with interpretable models", "under a tight compute budget"),
    "tabular_regression": ("with limited training data", "with interpretable models", "under a tight compute budget"),
    "time_series_forecasting": ("with a short training history", "at a longer forecast horizon", "with interpretable models"),
    "model_submission": ("with limited training data", "under a tight compute budget"),
    "game_strategy": ("under a tight compute budget", "with a short time horizon"),
    "unavailable": ("with limited training data", "under a tight compute budget"),
}


tokens = words  # the product's word tokens (gymforge.core.dedup), so the vocabulary and decontamination agree


def normalise(text: str) -> str:
    """An order-free key: casing, plurals, hyphenation and word order do not change it."""
    return " ".join(sorted(tokens(text)))


_QUALIFIER_TOKENS = sorted({tuple(tokens(q)) for qs in QUALIFIERS.values() for q in qs}, key=len, reverse=True)
_BY_KEY = {normalise(e.text): e for e in VOCABULARY}


def strip_qualifier(text: str) -> list[str]:
    """The topic's tokens without a trailing sampler qualifier."""
    words = tokens(text)
    for qualifier in _QUALIFIER_TOKENS:
        if len(words) > len(qualifier) and tuple(words[-len(qualifier):]) == qualifier:
            return words[: -len(qualifier)]
    return words


def lookup(text: str) -> VocabEntry | None:
    """The vocabulary entry a (possibly re-cased, pluralised, reordered or qualified) topic came from."""
    return _BY_KEY.get(" ".join(sorted(strip_qualifier(text))))


_FAMILY_HINTS: tuple[tuple[Family, re.Pattern[str]], ...] = (
    ("model_submission", re.compile(r"\btrain and submit\b")),
    ("game_strategy", re.compile(r"\b(game|auction|bidding|opponents?|bandits?|heuristics?|scheduling|packing)\b")),
    ("time_series_forecasting", re.compile(r"\b(forecast\w*|time[- ]series|nowcast\w*)\b")),
    ("tabular_regression", re.compile(r"\b(regress\w*|estimation|price|amount|counts?|yield)\b")),
)


def family_of(text: str) -> Family:
    """The vocabulary family, or a keyword guess for topics the vocabulary does not know."""
    entry = lookup(text)
    if entry is not None:
        return entry.family
    lowered = text.lower()
    return next((family for family, pattern in _FAMILY_HINTS if pattern.search(lowered)), "tabular_classification")
