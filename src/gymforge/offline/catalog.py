"""The real datasets bundled with PyPI packages that the offline hub serves, and how to load each one.

Every loader returns the data as its package ships it; `load_frame` only renames columns, drops rows
without a target and normalises dtypes, so no row is ever invented.
"""

from __future__ import annotations

import hashlib
import importlib
import json
import re
from typing import Callable, Literal

import numpy as np
import pandas as pd
from pydantic import BaseModel, ConfigDict, Field

Task = Literal["classification", "regression", "time-series"]

TASK_CATEGORIES: dict[Task, list[str]] = {
    "classification": ["tabular-classification"],
    "regression": ["tabular-regression"],
    "time-series": ["time-series-forecasting"],
}

# Bump when a loader or `load_frame` changes the stored data, so existing offline hubs rebuild.
FORMAT_VERSION = 1


class CatalogEntry(BaseModel):
    model_config = ConfigDict(frozen=True)

    id: str
    task: Task
    target: str = Field(description="Label column; for time series the value column.")
    time_column: str | None = Field(None, description="Ordering column of a time series.")
    description: str
    tags: tuple[str, ...]
    downloads: int
    license: str
    source: str = Field(description="Package function the rows come from.")
    renames: dict[str, str] = Field(default_factory=dict, description="Raw column -> clean name, where snake_case is not enough.")
    loader: Callable[[], pd.DataFrame] = Field(exclude=True)

    @property
    def dirname(self) -> str:
        return self.id.replace("/", "__")


def _sklearn(name: str, target: str, class_names: bool = False, **kwargs: object) -> Callable[[], pd.DataFrame]:
    def load() -> pd.DataFrame:
        from sklearn import datasets

        bunch = getattr(datasets, f"load_{name}")(as_frame=True, **kwargs)
        df = bunch.frame.rename(columns={"target": target})
        if class_names:
            df[target] = np.asarray(bunch.target_names)[bunch.target.to_numpy()]
        return df

    return load


def _statsmodels(name: str, index_name: str | None = None) -> Callable[[], pd.DataFrame]:
    def load() -> pd.DataFrame:
        df = importlib.import_module(f"statsmodels.datasets.{name}").load_pandas().data
        # Some sets keep a real column (date, state) in the index.
        return df.rename_axis(index_name).reset_index() if index_name else df

    return load


def _vega(name: str, dates: tuple[str, ...] = ()) -> Callable[[], pd.DataFrame]:
    def load() -> pd.DataFrame:
        from vega_datasets import local_data

        # Read the bundled file directly: the package's own reader relies on a pandas option being removed.
        spec = getattr(local_data, name.replace("-", "_"))
        df = pd.read_json(spec.filepath) if spec.format == "json" else pd.read_csv(spec.filepath)
        for col in dates:
            df[col] = pd.to_datetime(df[col])
        return df

    return load


def _vega_cars() -> pd.DataFrame:
    df = _vega("cars")()
    # Model years are stored as "1970-01-01"; the year is the information.
    df["Year"] = pd.to_datetime(df["Year"]).dt.year
    return df


def _penguins() -> pd.DataFrame:
    from palmerpenguins import load_penguins

    return load_penguins()


CATALOG: tuple[CatalogEntry, ...] = (
    # --- tabular classification ---
    CatalogEntry(
        id="sklearn/iris", task="classification", target="species", downloads=41000, license="cc-by-4.0",
        source="sklearn.datasets.load_iris", loader=_sklearn("iris", "species", class_names=True),
        tags=("tabular", "classification", "multi-class", "biology", "botany", "flowers"),
        description="Fisher's (1936) iris flowers: 150 flowers, 50 from each of three species (setosa, versicolor, "
        "virginica). Columns: sepal_length_cm, sepal_width_cm, petal_length_cm, petal_width_cm (centimetres) and "
        "the label species (string). The classic multi-class classification benchmark, from the UCI Machine "
        "Learning Repository as shipped with scikit-learn.",
    ),
    CatalogEntry(
        id="sklearn/wine", task="classification", target="cultivar", downloads=12000, license="cc-by-4.0",
        source="sklearn.datasets.load_wine", loader=_sklearn("wine", "cultivar"),
        tags=("tabular", "classification", "multi-class", "chemistry", "food", "wine"),
        description="Chemical analysis of 178 Italian wines from one region made from three grape cultivars. "
        "13 numeric columns (alcohol, malic_acid, ash, alcalinity_of_ash, magnesium, total_phenols, flavanoids, "
        "nonflavanoid_phenols, proanthocyanins, color_intensity, hue, od280_od315_of_diluted_wines, proline) and "
        "the label cultivar (0, 1 or 2). UCI Wine recognition data as shipped with scikit-learn.",
    ),
    CatalogEntry(
        id="sklearn/breast_cancer", task="classification", target="diagnosis", downloads=18000, license="cc-by-4.0",
        source="sklearn.datasets.load_breast_cancer", loader=_sklearn("breast_cancer", "diagnosis", class_names=True),
        tags=("tabular", "classification", "binary", "medical", "health", "cancer", "diagnosis", "biology"),
        description="Breast Cancer Wisconsin (Diagnostic): 569 breast-mass biopsies (fine-needle aspirates), each "
        "described by 30 numeric features: the mean, standard error and worst value of ten cell-nucleus "
        "properties (radius, texture, perimeter, area, smoothness, compactness, concavity, concave points, "
        "symmetry, fractal dimension), named like mean_radius, radius_error, worst_radius. Label diagnosis: "
        "'malignant' (212) or 'benign' (357). Binary medical classification from UCI via scikit-learn.",
    ),
    CatalogEntry(
        id="sklearn/digits", task="classification", target="digit", downloads=15000, license="cc-by-4.0",
        source="sklearn.datasets.load_digits", loader=_sklearn("digits", "digit"),
        tags=("tabular", "classification", "multi-class", "image", "computer-vision", "handwriting", "ocr"),
        description="1,797 handwritten digits as 8x8 grayscale images flattened into 64 integer pixel columns "
        "pixel_0_0 ... pixel_7_7 (pixel_<row>_<col>, intensity 0-16), plus the label digit (0-9). Optical "
        "Recognition of Handwritten Digits (UCI) as shipped with scikit-learn: a small image-recognition "
        "benchmark in tabular form.",
    ),
    CatalogEntry(
        id="palmerpenguins/penguins", task="classification", target="species", downloads=9000, license="cc0-1.0",
        source="palmerpenguins.load_penguins", loader=_penguins,
        tags=("tabular", "classification", "multi-class", "biology", "ecology", "animals", "penguins"),
        description="Palmer penguins: size measurements of 344 adult penguins of three species (Adelie, Chinstrap, "
        "Gentoo) on three islands (Biscoe, Dream, Torgersen) of the Palmer Archipelago, Antarctica, 2007-2009 "
        "(Gorman, Williams & Fraser, Palmer Station LTER). Columns: species (label), island, bill_length_mm, "
        "bill_depth_mm, flipper_length_mm, body_mass_g, sex ('male'/'female'), year. A few measurements and "
        "sex values are missing (null). Popular iris alternative for penguin species classification; body_mass_g "
        "also suits regression.",
    ),
    CatalogEntry(
        id="statsmodels/spector", task="classification", target="grade", downloads=800, license="other",
        source="statsmodels.datasets.spector.load_pandas", loader=_statsmodels("spector"),
        tags=("tabular", "classification", "binary", "education", "economics", "logit"),
        description="Spector & Mazzeo (1980) teaching-program effectiveness: 32 economics students. Columns: gpa "
        "(grade point average), tuce (score on an economics pre-test), psi (1 if taught with the Personalized "
        "System of Instruction) and the label grade (1 if the student's grade improved, else 0). Tiny binary "
        "classification / logit example from statsmodels (used with the author's permission).",
    ),
    CatalogEntry(
        id="statsmodels/anes96", task="classification", target="vote", downloads=1500, license="public-domain",
        source="statsmodels.datasets.anes96.load_pandas", loader=_statsmodels("anes96"),
        renames={"TVnews": "tv_news", "selfLR": "self_lr", "ClinLR": "clinton_lr", "DoleLR": "dole_lr",
                 "PID": "party_id", "logpopul": "log_popul"},
        tags=("tabular", "classification", "binary", "politics", "elections", "survey", "social-science"),
        description="American National Election Studies 1996 survey subset: 944 voters. Label vote (expected vote: "
        "0 = Clinton, 1 = Dole). Features: party_id (0 strong Democrat ... 6 strong Republican), self_lr, "
        "clinton_lr, dole_lr (1 extremely liberal ... 7 extremely conservative: own position and perceived "
        "positions of Clinton and Dole), tv_news (days per week watching TV news), popul (population of the "
        "census place, thousands), log_popul, age, educ (1-7), income (household income bracket 1-24). "
        "From statsmodels.",
    ),
    CatalogEntry(
        id="statsmodels/modechoice", task="classification", target="choice", downloads=600, license="public-domain",
        source="statsmodels.datasets.modechoice.load_pandas", loader=_statsmodels("modechoice"),
        tags=("tabular", "classification", "binary", "transportation", "travel", "discrete-choice", "economics"),
        description="Travel mode choice between Sydney, Canberra and Melbourne (Greene & Hensher 1997): 210 "
        "travellers x 4 alternatives (mode 1 air, 2 train, 3 bus, 4 car) = 840 rows. Label choice (1 if this "
        "alternative was chosen). Features: ttme (terminal waiting time, minutes; 0 for car), invc (in-vehicle "
        "cost, dollars), invt (in-vehicle time, minutes), gc (generalised cost, dollars), hinc (household "
        "income, $1000s), psize (travelling party size); individual groups the 4 rows of one traveller. "
        "From statsmodels.",
    ),
    # --- tabular regression ---
    CatalogEntry(
        id="sklearn/diabetes", task="regression", target="progression", downloads=16000, license="bsd-3-clause",
        source="sklearn.datasets.load_diabetes(scaled=False)", loader=_sklearn("diabetes", "progression", scaled=False),
        tags=("tabular", "regression", "medical", "health", "diabetes"),
        description="Diabetes disease progression (Efron et al. 2004, Least Angle Regression): 442 patients with "
        "ten baseline variables and the regression target progression, a quantitative measure of disease "
        "progression one year after baseline (25-346). Columns: age (years), sex (1 or 2), bmi (body mass "
        "index), bp (mean blood pressure) and six blood serum measurements s1 (total cholesterol), s2 (LDL), "
        "s3 (HDL), s4 (total/HDL cholesterol), s5 (log triglycerides), s6 (blood sugar). Raw, unscaled values "
        "from scikit-learn.",
    ),
    CatalogEntry(
        id="sklearn/linnerud", task="regression", target="weight", downloads=900, license="bsd-3-clause",
        source="sklearn.datasets.load_linnerud", loader=_sklearn("linnerud", "weight"),
        tags=("tabular", "regression", "multi-output", "fitness", "sports", "health"),
        description="Linnerud physical exercise data: 20 middle-aged men at a fitness club. Exercise columns chins, "
        "situps, jumps and physiological columns weight (pounds, the default target), waist (inches) and pulse "
        "(beats per minute); waist and pulse are alternative targets (multi-output regression). From scikit-learn.",
    ),
    CatalogEntry(
        id="statsmodels/stackloss", task="regression", target="stack_loss", downloads=700, license="public-domain",
        source="statsmodels.datasets.stackloss.load_pandas", loader=_statsmodels("stackloss"),
        renames={"STACKLOSS": "stack_loss", "AIRFLOW": "air_flow", "WATERTEMP": "water_temp", "ACIDCONC": "acid_conc"},
        tags=("tabular", "regression", "industrial", "chemistry", "engineering"),
        description="Brownlee (1965) stack loss plant data: 21 days of operation of a plant oxidising ammonia to "
        "nitric acid. Target stack_loss (10 x the percentage of ingoing ammonia that escapes unabsorbed); "
        "features air_flow (rate of operation), water_temp (cooling water temperature) and acid_conc (acid "
        "concentration). Classic robust-regression example from statsmodels.",
    ),
    CatalogEntry(
        id="statsmodels/longley", task="regression", target="total_employment", downloads=650, license="public-domain",
        source="statsmodels.datasets.longley.load_pandas", loader=_statsmodels("longley"),
        renames={"TOTEMP": "total_employment", "GNPDEFL": "gnp_deflator", "UNEMP": "unemployed",
                 "ARMED": "armed_forces", "POP": "population"},
        tags=("tabular", "regression", "economics", "employment", "macroeconomics"),
        description="Longley (1967) US macroeconomic data, 1947-1962 (16 years): target total_employment, with "
        "gnp_deflator, gnp, unemployed, armed_forces, population and year. Highly collinear; a classic test of "
        "least-squares accuracy (NIST StRD). From statsmodels.",
    ),
    CatalogEntry(
        id="statsmodels/ccard", task="regression", target="avg_exp", downloads=500, license="other",
        source="statsmodels.datasets.ccard.load_pandas", loader=_statsmodels("ccard"),
        renames={"AVGEXP": "avg_exp", "INCOMESQ": "income_sq", "OWNRENT": "own_rent"},
        tags=("tabular", "regression", "finance", "credit", "economics", "consumer"),
        description="William Greene's credit card expenditure data: 72 card holders. Target avg_exp (average "
        "monthly credit card expenditure, dollars); features age (years), income (annual, $10,000s), income_sq "
        "(income squared) and own_rent (1 if the holder owns a home). From Greene's Econometric Analysis via "
        "statsmodels (used with the author's permission).",
    ),
    CatalogEntry(
        id="statsmodels/engel", task="regression", target="foodexp", downloads=550, license="public-domain",
        source="statsmodels.datasets.engel.load_pandas", loader=_statsmodels("engel"),
        tags=("tabular", "regression", "economics", "household", "consumption", "quantile-regression"),
        description="Engel (1857) food expenditure: 235 Belgian working-class households. Target foodexp (annual "
        "food expenditure, Belgian francs) and income (annual household income, Belgian francs). The standard "
        "quantile-regression example (Koenker & Bassett 1982), from statsmodels.",
    ),
    CatalogEntry(
        id="statsmodels/grunfeld", task="regression", target="invest", downloads=750, license="public-domain",
        source="statsmodels.datasets.grunfeld.load_pandas", loader=_statsmodels("grunfeld"),
        tags=("tabular", "regression", "economics", "finance", "investment", "panel-data"),
        description="Grunfeld (1950) investment panel: 11 large US firms (General Motors, US Steel, IBM, ...) over "
        "1935-1954, 220 rows. Target invest (gross investment, 1947 dollars); features value (market value), "
        "capital (stock of plant and equipment), firm (name) and year. From statsmodels.",
    ),
    CatalogEntry(
        id="statsmodels/fair", task="regression", target="affairs", downloads=1100, license="other",
        source="statsmodels.datasets.fair.load_pandas", loader=_statsmodels("fair"),
        tags=("tabular", "regression", "social-science", "survey", "psychology", "marriage"),
        description="Fair (1978) extramarital affairs survey: 6,366 married women (Redbook magazine, 1974). Target "
        "affairs (time spent in extramarital affairs; 0 for most); features rate_marriage (1 very poor ... 5 very "
        "good), age, yrs_married, children, religious (1 not ... 4 strongly), educ (years), occupation and "
        "occupation_husb (1 student ... 6 professional). Also used as binary classification (affairs > 0). "
        "From statsmodels.",
    ),
    CatalogEntry(
        id="statsmodels/randhie", task="regression", target="mdvis", downloads=450, license="public-domain",
        source="statsmodels.datasets.randhie.load_pandas", loader=_statsmodels("randhie"),
        tags=("tabular", "regression", "count-data", "health", "medical", "insurance", "economics"),
        description="RAND Health Insurance Experiment: 20,190 person-years. Target mdvis (number of outpatient "
        "doctor visits, a count); features lncoins (log coinsurance + 1), idp (individual deductible plan), lpi "
        "(log participation incentive), fmde, physlm (physical limitation), disea (number of chronic diseases), "
        "hlthg / hlthf / hlthp (self-rated health good / fair / poor). Count regression data from statsmodels.",
    ),
    CatalogEntry(
        id="statsmodels/statecrime", task="regression", target="murder", downloads=600, license="public-domain",
        source="statsmodels.datasets.statecrime.load_pandas", loader=_statsmodels("statecrime", index_name="state"),
        tags=("tabular", "regression", "crime", "social-science", "demographics"),
        description="US state crime statistics 2009: 50 states plus DC. Target murder (murders per 100,000); "
        "features state, violent (violent crimes per 100,000), hs_grad (% high-school graduates), poverty (% "
        "below the poverty line), single (% single-parent households), white (% white), urban (% in urbanized "
        "areas). From the American Statistical Abstract via statsmodels.",
    ),
    CatalogEntry(
        id="statsmodels/heart", task="regression", target="survival", downloads=400, license="unknown",
        source="statsmodels.datasets.heart.load_pandas", loader=_statsmodels("heart"),
        tags=("tabular", "regression", "survival-analysis", "medical", "health", "censored"),
        description="Stanford heart transplant survival (Miller 1976): 69 patients. Target survival (days after "
        "transplant surgery until death), censors (1 if the death was observed, 0 if censored) and age at "
        "surgery. Censored regression / survival analysis data from statsmodels.",
    ),
    CatalogEntry(
        id="vega/cars", task="regression", target="miles_per_gallon", downloads=8000, license="bsd-3-clause",
        source="vega_datasets.local_data.cars", loader=_vega_cars,
        tags=("tabular", "regression", "automotive", "cars", "fuel-efficiency"),
        description="Auto MPG: 398 car models from 1970-1982 (the 8 without a mileage value are dropped). Target "
        "miles_per_gallon; features name, cylinders, displacement (cubic inches), horsepower (6 missing), "
        "weight_in_lbs, acceleration (seconds 0-60 mph), year (model year) and origin (USA, Europe, Japan). "
        "From StatLib (Donoho et al. 1982) via vega_datasets.",
    ),
    CatalogEntry(
        id="vega/barley", task="regression", target="yield", downloads=300, license="bsd-3-clause",
        source="vega_datasets.local_data.barley", loader=_vega("barley"),
        tags=("tabular", "regression", "agriculture", "crops", "experiment"),
        description="Minnesota barley trials (Immer et al. 1934): 120 plots, 10 barley varieties grown at 6 sites "
        "in 1931 and 1932. Target yield (bushels per acre); features variety, site and year. Famous from "
        "Cleveland's Visualizing Data. From vega_datasets.",
    ),
    # --- time series ---
    CatalogEntry(
        id="statsmodels/sunspots", task="time-series", target="sun_activity", time_column="year", downloads=2500,
        license="public-domain", source="statsmodels.datasets.sunspots.load_pandas", loader=_statsmodels("sunspots"),
        renames={"SUNACTIVITY": "sun_activity"},
        tags=("time-series", "forecasting", "astronomy", "solar", "yearly"),
        description="Yearly sunspot numbers 1700-2008 (309 years) from the US National Geophysical Data Center. "
        "Columns year and sun_activity (yearly sunspot number). Classic univariate series with an ~11-year "
        "cycle, for forecasting. From statsmodels.",
    ),
    CatalogEntry(
        id="statsmodels/nile", task="time-series", target="volume", time_column="year", downloads=1200,
        license="public-domain", source="statsmodels.datasets.nile.load_pandas", loader=_statsmodels("nile"),
        tags=("time-series", "forecasting", "hydrology", "river", "climate", "yearly", "changepoint"),
        description="Annual flow of the river Nile at Aswan, 1871-1970 (100 years). Columns year and volume "
        "(discharge, 10^8 cubic metres). Known changepoint around 1898; used for forecasting and changepoint "
        "detection (Cobb 1978). From statsmodels.",
    ),
    CatalogEntry(
        id="statsmodels/co2", task="time-series", target="co2", time_column="date", downloads=3000,
        license="public-domain", source="statsmodels.datasets.co2.load_pandas", loader=_statsmodels("co2", "date"),
        tags=("time-series", "forecasting", "climate", "environment", "atmosphere", "weekly"),
        description="Weekly atmospheric CO2 at Mauna Loa Observatory, Hawaii, March 1958 - December 2001 (Keeling & "
        "Whorf, Scripps). Columns date (ISO week-ending date) and co2 (concentration, ppmv); weeks without a "
        "measurement are dropped (2,225 rows). Trend plus yearly seasonality, for forecasting. From statsmodels.",
    ),
    CatalogEntry(
        id="statsmodels/macrodata", task="time-series", target="realgdp", time_column="year", downloads=2000,
        license="public-domain", source="statsmodels.datasets.macrodata.load_pandas", loader=_statsmodels("macrodata"),
        tags=("time-series", "forecasting", "economics", "macroeconomics", "gdp", "quarterly"),
        description="US quarterly macroeconomic data 1959Q1-2009Q3 (203 quarters, FRED and BLS). Columns year, "
        "quarter, realgdp (real GDP, default target; billions of chained 2005 dollars), realcons, realinv, "
        "realgovt, realdpi (real consumption, investment, government spending, disposable income), cpi, m1, "
        "tbilrate (3-month T-bill rate), unemp (unemployment rate %), pop, infl (inflation), realint (real "
        "interest rate). Multivariate series, from statsmodels.",
    ),
    CatalogEntry(
        id="vega/seattle-weather", task="time-series", target="temp_max", time_column="date", downloads=5000,
        license="bsd-3-clause", source="vega_datasets.local_data.seattle_weather", loader=_vega("seattle-weather", dates=("date",)),
        tags=("time-series", "forecasting", "weather", "climate", "daily", "classification"),
        description="Daily Seattle weather 2012-2015 (1,461 days, NOAA). Columns date, precipitation (mm), temp_max "
        "(default target) and temp_min (degrees C), wind (m/s) and weather (drizzle, rain, sun, snow, fog; "
        "also usable as a classification label). From vega_datasets.",
    ),
    CatalogEntry(
        id="vega/us-employment", task="time-series", target="nonfarm", time_column="month", downloads=1300,
        license="bsd-3-clause", source="vega_datasets.local_data.us_employment", loader=_vega("us-employment", dates=("month",)),
        tags=("time-series", "forecasting", "economics", "employment", "labor", "monthly"),
        description="US employment by industry, monthly 2006-2015 (120 months, Bureau of Labor Statistics, "
        "seasonally adjusted, thousands of jobs). Columns month, nonfarm (total nonfarm payrolls, default "
        "target), private, goods_producing, construction, manufacturing, retail_trade, government and other "
        "sectors, and nonfarm_change (month-on-month change). From vega_datasets.",
    ),
)

BY_ID: dict[str, CatalogEntry] = {e.id: e for e in CATALOG}


def fingerprint() -> str:
    """Changes whenever the catalog or the loading code's output format changes."""
    payload = {"format": FORMAT_VERSION, "entries": [e.model_dump(mode="json") for e in CATALOG]}
    return hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()[:16]


def snake_case(name: str) -> str:
    name = re.sub(r"([a-z0-9])([A-Z])", r"\1_\2", name)
    return re.sub(r"[^0-9a-zA-Z]+", "_", name).strip("_").lower()


def load_frame(entry: CatalogEntry) -> pd.DataFrame:
    """The entry's rows with clean column names and `datasets`-friendly dtypes; only target-less rows dropped."""
    df = entry.loader().rename(columns=entry.renames)
    df.columns = [snake_case(str(c)) for c in df.columns]
    if df.columns.duplicated().any():
        raise ValueError(f"{entry.id}: duplicate column names after cleaning: {list(df.columns)}")
    missing = {entry.target, entry.time_column} - set(df.columns) - {None}
    if missing:
        raise ValueError(f"{entry.id}: columns {sorted(missing)} not in {list(df.columns)}")
    df = df.dropna(how="all").dropna(subset=[entry.target])
    for col in df.columns:
        s = df[col]
        if pd.api.types.is_datetime64_any_dtype(s):
            # ISO strings survive every consumer (JSON, Arrow, pandas) without timezone surprises.
            s = s.dt.strftime("%Y-%m-%d" if (s.dt.normalize() == s).all() else "%Y-%m-%dT%H:%M:%S")
        if pd.api.types.is_float_dtype(s) and s.notna().all() and (s == s.round()).all():
            s = s.astype("int64")  # codes and years the packages store as floats
        elif pd.api.types.is_integer_dtype(s):
            s = s.astype("int64")
        elif isinstance(s.dtype, pd.StringDtype) or pd.api.types.is_object_dtype(s):
            s = s.astype(object)  # becomes plain Arrow `string`, not `large_string`
        df[col] = s
    if entry.time_column:
        df = df.sort_values(entry.time_column, kind="stable")
    return df.reset_index(drop=True)
