"""Which corpus documents the rules may be tuned on, and which they are reported on.

SPEC §7: every quality figure is reported on corpus questions and documents the rules were not
tuned on. The split is by document (a rule fitted to one contract's drafting must show on
another's), fixed here once so that every benchmark and test uses the same one:

- contracts: the three first contracts (the 123 gold questions of
  `qa/cuad_gold_subset_3contracts.jsonl`) and six of the twelve added with
  `qa/cuad_dev_more.jsonl` are for tuning; the other six, one of each remaining contract type,
  are held out;
- filings: the five first 10-Ks (the 19 questions of `qa/financebench_dev.jsonl`) are for
  tuning; the eleven added with `qa/financebench_dev_more.jsonl` (11 questions) are held out.

Look at held-out documents to understand a failure if you must, but fit no rule, weight,
threshold or word list to them; a change is real when the held-out figures move too.
"""

from __future__ import annotations

import json
from pathlib import Path

CORPUS = (Path(__file__).resolve().parents[1] / ".." / "shared" / "corpus").resolve()

TUNE_CONTRACTS = frozenset({
    "contract_ArrayBioPharma_Ono_License_Development_Commercialization_Agreement.pdf",
    "contract_GooseheadInsurance_Franchise_Agreement.pdf",
    "contract_IBM_MSL_Outsourcing_Agreement.pdf",
    "contract_BellringBrandsInc_20190920_S_1_EX_10_12_11817081_EX_10_12_Manufacturing_Agreement1.pdf",
    "contract_FOUNDATIONMEDICINE_INC_02_02_2015_EX_10_2_Collaboration_Agreement.pdf",
    "contract_LIMEENERGYCO_09_09_1999_EX_10_DISTRIBUTOR_AGREEMENT.pdf",
    "contract_MEDIWOUNDLTD_01_15_2014_EX_10_6_SUPPLY_AGREEMENT.pdf",
    "contract_MOELIS_CO_03_24_2014_EX_10_19_STRATEGIC_ALLIANCE_AGREEMENT.pdf",
    "contract_ZEBRATECHNOLOGIESCORP_04_16_2014_EX_10_1_INTELLECTUAL_PROPERTY_AGREEMENT.pdf",
})
HELD_OUT_CONTRACTS = frozenset({
    "contract_BONTONSTORESINC_04_20_2018_EX_99_3_AGENCY_AGREEMENT.pdf",
    "contract_KINGPHARMACEUTICALSINC_08_09_2006_EX_10_1_PROMOTION_AGREEMENT.pdf",
    "contract_MJBIOTECH_INC_12_06_2018_EX_99_01_JOINT_VENTURE_AGREEMENT.pdf",
    "contract_Quaker_Chemical_Corporation_NON_COMPETITION_AND_NON_SOLICITATION_AGREEMENT.pdf",
    "contract_ReynoldsConsumerProductsInc_20200121_S_1A_EX_10_22_11948918_EX_10_22_Service_Agreement.pdf",
    "contract_VirtuosoSurgicalInc_20191227_1_A_EX1A_6_MAT_CTRCT_11933379_EX1A_6_MAT_CTRCT_License_Agreement.pdf",
})
TUNE_FILINGS = frozenset(f"filing_{name}_10K.pdf" for name in (
    "AMERICANEXPRESS_2022", "BESTBUY_2023", "BLOCK_2020", "CORNING_2022", "PEPSICO_2022"))
HELD_OUT_FILINGS = frozenset(f"filing_{name}_10K.pdf" for name in (
    "AMERICANWATERWORKS_2020", "COCACOLA_2017", "COSTCO_2021", "GENERALMILLS_2019", "KRAFTHEINZ_2019",
    "LOCKHEEDMARTIN_2020", "MGMRESORTS_2018", "MICROSOFT_2016", "NETFLIX_2015", "NIKE_2018", "WALMART_2020"))

CUAD_FILES = ("cuad_gold_subset_3contracts.jsonl", "cuad_dev_more.jsonl")
FINANCEBENCH_FILES = ("financebench_dev.jsonl", "financebench_dev_more.jsonl")


def part(doc_file: str) -> str:
    """"tune" or "held out" for a corpus document (a file name or a `doc_file` such as
    "pdf/contract_….pdf"); ValueError for a document in neither part."""
    name = Path(doc_file).name
    if name in TUNE_CONTRACTS or name in TUNE_FILINGS:
        return "tune"
    if name in HELD_OUT_CONTRACTS or name in HELD_OUT_FILINGS:
        return "held out"
    raise ValueError(f"{name} is in neither part of the corpus split")


def _rows(files: tuple[str, ...], corpus: Path) -> list[dict]:
    rows = []
    for name in files:
        with open(corpus / "qa" / name, encoding="utf-8") as f:
            for line in f:
                if line.strip():
                    row = json.loads(line)
                    row["part"] = part(row["doc_file"])
                    rows.append(row)
    return rows


def cuad_questions(corpus: Path = CORPUS) -> list[dict]:
    """Every CUAD gold record of the fifteen contracts (both gold files), each with its `part`."""
    return _rows(CUAD_FILES, corpus)


def financebench_questions(corpus: Path = CORPUS) -> list[dict]:
    """The 30 FinanceBench questions, each with its `part`."""
    return _rows(FINANCEBENCH_FILES, corpus)
