"""The lookup of lost ids cuts each foreign line's leading id out (photon.app._verify._cut: the strict-shape
scanner's reading when the session has it, else by position, photon.app._verify._leading_id) and parses as
JSON only the lines whose cut id is wanted or which it cannot vouch for: either way it finds exactly the lines
that parsing every line finds, on random lines of every shape."""
from __future__ import annotations

import random
from pathlib import Path

import pytest

from photon import load_config

FIELDS = ("query_id", "ad", "x", "_photon")


def _line(rnd: random.Random, pool: list[str]) -> bytes:
    """One foreign line: mostly the usual shape, else one of the shapes the cut must not misread."""
    a, b, q = rnd.choice(pool), rnd.choice(pool), rnd.choice(pool)
    esc = a.replace(":", "\\u003a")
    shapes = [
        f'{{"click_id":"{a}","query_id":"{q}","ad":1}}',
        f'{{"click_id":"{a}"}}',
        f'{{"click_id":"{a}","_photon":{{"region":"a"}}}}',
        f'{{"ad":1,"click_id":"{a}"}}',                                   # the id not first
        f'{{"click_id":"{esc}","query_id":"{q}"}}',                       # an escaped id
        f'{{"click_id":"{a}","query_id":"{q}","click_id":"{b}"}}',        # the field twice
        f'{{"click_id":"{a}","click\\u005fid":"{b}"}}',                   # the field again, its name escaped
        f'{{"click\\u005fid":"{a}"}}',
        f'{{"click_id":"{a}","x":{{"click_id":"{b}"}}}}',                 # nested
        f'{{"click_id":"{a}","x":"\\"click_id\\""}}',                     # the name inside a value
        f'{{"click_id":"{a}","x":"a\\"b"}}',                              # an escaped quote after the id
        f'{{"click_id":"{a}\\"{b}","x":1}}',                              # an escaped quote in the id
        f'{{"click_id":"{a}\\\\","x":1}}',                                # an escaped backslash ending the id
        f'{{"click_id":"{a}","query_id":"{q}"',                           # torn
        f'{{"click_id":"{a}',                                              # torn inside the id
        f'{{"click_id":"{a}"',
        f'{{"click_id":"{a}",}}',                                          # not JSON after a good start
        f'{{"click_id":"{a}"}}x',
        f'{{"click_id":"{a}"}} ',
        f'{{ "click_id":"{a}"}}',                                          # blanks
        f'{{"click_id" : "{a}"}}',
        f'{{"click_id":"{a}" ,"ad":2}}',
        f'{{"click_id":123,"x":"{a}"}}',                                   # not a string
        f'{{"click_id":"","x":"{a}"}}',                                    # empty
        f'{{"click_id":"{a}\t{b}"}}',                                      # a raw control byte
        f'{{"click_id":"{a}é"}}',                                          # not ASCII
        f'{{"CLICK_ID":"{a}"}}',
        f'[{{"click_id":"{a}"}}]',
        f'{{"click_id":"{a}"{b}"}}',
        "".join(rnd.choice('{}":,\\ax' + a[:3]) for _ in range(rnd.randint(0, 30))),     # noise
    ]
    if rnd.random() < 0.5:
        return shapes[0].encode()
    line = rnd.choice(shapes)
    for _ in range(rnd.randint(0, 1)):       # another member here and there
        k = rnd.choice(FIELDS)
        if line.endswith("}"):
            line = line[:-1] + f',"{k}":"{rnd.choice(pool)}"}}'
    return line.encode()


def _world(root: Path, seed: int):
    rnd = random.Random(seed)
    (root / "photon.toml").write_text('[[regions]]\nname = "a"\nlog_root = "logs"\noutput_root = "out"\n'
                                      'state_dir = "state"\n')
    pool = [f"10.0.0.{rnd.randint(1, 9)}:{rnd.randint(1, 99)}:{1764000000000000 + rnd.randint(0, 40)}"
            for _ in range(60)] + ["a", "a:b", "é:1", ""]
    for k in range(3):
        path = root / f"logs/clicks/c-{k}.jsonl"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(b"".join(_line(rnd, pool) + b"\n" for _ in range(300)))
    wanted = sorted(set(rnd.sample(pool, 30)) | {"a:b"})
    return load_config(root / "photon.toml"), wanted


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_the_leading_id_cut_finds_the_lines_that_parsing_every_line_finds(tmp_path, spark, seed):
    from pyspark.sql import functions as F

    from photon.app._verify import _foreign_inputs, _ids, _lines_of, _one_of
    config, wanted = _world(tmp_path, seed)
    foreign = _foreign_inputs(spark, config)
    ids, ref = config.join.foreign_ids, config.join.foreign_ref_field
    # the simple form: every line parsed as JSON, its id kept when wanted
    simple = sorted((r["id"], r["value"], r["ref"]) for _, lines in foreign
                    for r in _ids(lines.values(spark), ids, ref).filter(_one_of("id", wanted)).collect())
    assert len({i for i, _, _ in simple}) >= 10          # the world holds wanted ids in many shapes
    by_value = sorted((r["id"], r["raw"], r["ref"]) for r in _lines_of(spark, config, foreign, wanted).collect())
    assert by_value == simple
    wanted_df = spark.createDataFrame([(i,) for i in wanted], "id string")
    joined = {r["id"]: (r["raw"], r["ref"]) for r in _lines_of(spark, config, foreign, wanted_df).collect()}
    assert set(joined) == {i for i, _, _ in simple}
    assert all((i, raw, ref_) in simple for i, (raw, ref_) in joined.items())
    # the cut vouches for most lines of the usual shape (else it would be no pre-filter at all)
    from photon.app._verify import _leading_id
    fast, unsure = _leading_id("click_id")
    text = foreign[0][1].values(spark)
    sure = text.filter((fast != "") & ~unsure).count()
    assert sure > text.filter(F.col("value").startswith('{"click_id":"')).count() // 2


@pytest.fixture(scope="module")
def scanner(spark):
    from photon.app import _scanner
    name = _scanner.function(spark)
    assert name is not None, "the scanner's class is on the test session's classpath (javac is there)"
    return name


@pytest.mark.parametrize("seed", [1, 2, 3, 4])
def test_the_scanners_cut_finds_the_lines_that_parsing_every_line_finds(tmp_path, spark, scanner, seed):
    """The lookup with the scanner's cut (the job's own, run_verify passes it): by value and by join, exactly
    the lines and references of the wanted ids that json_tuple on every line finds."""
    from pyspark.sql import functions as F

    from photon.app._verify import _cut, _foreign_inputs, _ids, _lines_of, _one_of
    config, wanted = _world(tmp_path, seed)
    foreign = _foreign_inputs(spark, config)
    ids, ref = config.join.foreign_ids, config.join.foreign_ref_field
    simple = sorted((r["id"], r["value"], r["ref"]) for _, lines in foreign
                    for r in _ids(lines.values(spark), ids, ref).filter(_one_of("id", wanted)).collect())
    assert len({i for i, _, _ in simple}) >= 10
    by_value = sorted((r["id"], r["raw"], r["ref"])
                      for r in _lines_of(spark, config, foreign, wanted, function=scanner).collect())
    assert by_value == simple
    wanted_df = spark.createDataFrame([(i,) for i in wanted], "id string")
    joined = {r["id"]: (r["raw"], r["ref"])
              for r in _lines_of(spark, config, foreign, wanted_df, function=scanner).collect()}
    assert set(joined) == {i for i, _, _ in simple}
    assert all((i, raw, ref_) in simple for i, (raw, ref_) in joined.items())
    # the scanner vouches for the lines of the usual shape (else it would be no pre-filter at all), and for
    # none that json_tuple reads another id from
    fast, unsure = _cut(ids, scanner)
    text = foreign[0][1].values(spark)
    cut = _ids(text.select("value", fast.alias("fast"), unsure.alias("unsure")), ids, ref)
    assert cut.filter((F.col("fast") != "") & ~F.col("unsure")).count() \
        >= text.filter(F.col("value").startswith('{"click_id":"')).count() // 2
    assert cut.filter((F.col("fast") != "") & ~F.col("unsure")
                      & ~F.col("id").eqNullSafe(F.col("fast"))).count() == 0
