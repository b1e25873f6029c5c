"""The verification job's id-format check: a cheap byte test in front of the pipeline's pattern, whose result
must be exactly the pattern's as Java reads it (its ``$`` also matches before a final line terminator)."""
from __future__ import annotations

import random

import pytest

from photon import IdGenerator
from photon.app._verify import ID_PATTERN, _cheaply_well_formed, _well_formed

TERMINATORS = ("\n", "\r", "\r\n", "\u0085", "\u2028", "\u2029")
ODD = (":", "\n", "\r", "\u0085", "\u2028", "\u2029", " ", "\t", "\x00", "\x1f", "\x7f", "+", "-", ".", "e",
       "é", "０", "٣", "\ufeff", "0")


def _digits(rnd: random.Random, n: int, first_zero_ok: bool = True) -> str:
    text = "".join(rnd.choice("0123456789") for _ in range(n))
    return text if first_zero_ok or not text or text[0] != "0" else rnd.choice("123456789") + text[1:]


def _perturb(rnd: random.Random, text: str) -> str:
    """``text`` with one to three characters replaced by, or with odd ones inserted (line terminators,
    blanks, control bytes, signs, a decimal point, non-ASCII digits, colons)."""
    chars = list(text)
    for _ in range(rnd.randint(1, 3)):
        at = rnd.randint(0, len(chars))
        odd = rnd.choice(ODD)
        if chars and at < len(chars) and rnd.random() < 0.5:
            chars[at] = odd
        else:
            chars.insert(at, odd)
    return "".join(chars)


def _ids(seed: int, n: int) -> list[str]:
    """Ids as the pipeline writes them, and near misses of every kind around the pattern's edges."""
    rnd = random.Random(seed)
    gen = IdGenerator("10.1.1.1", 77)
    out = [gen.next_id() for _ in range(200)]
    out += ["a:1:1763712000000000", ":1:1763712000000000", "\n:1:1763712000000000", "a\nb:1:1763712000000000",
            "a:1:0763712000000000", "a:0:1763712000000000", "a:01:1763712000000000", "a::1763712000000000",
            ":a:1:1763712000000000", "a:1:176371200000000", "a:1:17637120000000000", "1:1763712000000000",
            "a:1:+763712000000000", "a:1: 763712000000000", "a:1:1763712000000000 ", "a:1:176371200000000.",
            "a:1:1763712.00000000", "a:+1:1763712000000000", "a: 1:1763712000000000", "a:1 :1763712000000000",
            "a:1.0:1763712000000000", "a:123456789012345:1763712000000000",
            "a:1234567890123456:1763712000000000", "a:1234567890123456789012:1763712000000000", "", ":", "\n",
            "é:1:1763712000000000", "a:١:1763712000000000", "a:1:١763712000000000", "\r:1:1763712000000000",
            "a\r:1:1763712000000000", "a:1:1763712000000000\n\n", "a:1:1763712000000000\r\r"]
    out += ["a:1:1763712000000000" + t for t in TERMINATORS]
    out += ["a:1:0000000000000000" + t for t in TERMINATORS]
    for _ in range(n):
        prefix = rnd.choice(["10.1.1.1", "h", "a:b", "::1", "x y", "é", rnd.choice(ODD) + "a", ""])
        pid = _digits(rnd, rnd.choice((0, 1, 1, 2, 5, 15, 16, 20)), rnd.random() < 0.3)
        ts = _digits(rnd, rnd.choice((15, 16, 16, 16, 17)), rnd.random() < 0.3)
        text = f"{prefix}:{pid}:{ts}"
        roll = rnd.random()
        if roll < 0.4:
            text = _perturb(rnd, text)
        elif roll < 0.55:
            text += rnd.choice(TERMINATORS + ("\n\n", " ", "\t", "x"))
        out.append(text)
    return out


@pytest.fixture(scope="module")
def scanner(spark):
    from photon.app import _scanner
    name = _scanner.function(spark)
    assert name is not None, "the scanner's class is on the test session's classpath (javac is there)"
    return name


@pytest.mark.timeout(300)
@pytest.mark.parametrize("seed", [1, 2, 3])
@pytest.mark.parametrize("form", ["sql", "class"])
def test_the_cheap_test_in_front_of_the_pattern_gives_the_patterns_result_on_random_and_odd_ids(spark, seed, form,
                                                                                                 request):
    """Every id, random or built to sit on an edge of the pattern (line terminators anywhere and at the end,
    blanks, control bytes, signs, decimal points, non-ASCII digits, missing or extra colons and digits,
    zeros first): the job's check equals the pattern alone, the cheap test never accepts an id the pattern
    rejects, and it vouches for every id the pipeline writes (so the pattern runs only for the others).
    Both forms of the cheap test: Spark's string functions, and the scanner's class (the job's when the
    scanner is registered); and the class's test equals the string functions' on every id."""
    from pyspark.sql import functions as F
    scanner = request.getfixturevalue("scanner") if form == "class" else None
    ids = _ids(seed, 6000)
    df = spark.createDataFrame([(i,) for i in ids] + [(None,)], "id string")
    rows = df.select("id", F.col("id").rlike(ID_PATTERN).alias("pattern"),
                     _well_formed("id", scanner).alias("job"), _cheaply_well_formed("id", scanner).alias("cheap"),
                     _cheaply_well_formed("id").alias("sql")).collect()
    assert len(rows) == len(ids) + 1
    differ = [(r.id, r.pattern, r.job) for r in rows if r.job != r.pattern]
    assert not differ, differ[:10]
    wrongly_cheap = [r.id for r in rows if r.cheap and not r.pattern]
    assert not wrongly_cheap, wrongly_cheap[:10]
    accepted = [r for r in rows if r.pattern]
    rejected = [r for r in rows if r.pattern is False]
    assert len(accepted) > 1000 and len(rejected) > 1000       # both sides of the edge are exercised
    assert any(r.pattern and not r.cheap for r in rows)         # and ids only the pattern vouches for
    written = set(ids[:200])
    assert all(r.cheap for r in rows if r.id in written)
    differ = [(r.id, r.cheap, r.sql) for r in rows if bool(r.cheap) != bool(r.sql)]
    assert not differ, differ[:10]
