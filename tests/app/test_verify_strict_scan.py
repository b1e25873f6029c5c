"""The verification job's strict-shape scanner (photon.app._scanner, photon/app/java/PhotonStrictId.java): the
ids it reads are Spark's JSON reader's, file by file and for the whole report, on random lines of many shapes;
without its class or without javac the job reads with the JSON reader; its jar is keyed by its source and JDK."""
from __future__ import annotations

import logging
import random
import re
import zipfile
from pathlib import Path

import orjson
import pytest

import idregistry
from photon import IdGenerator, load_config
from photon.app import _scanner, read_recoverable, run_verify

GEN = IdGenerator("10.4.4.4", 4444)
NAME = "click_id"


def _string(rnd: random.Random, pool: list[str]) -> str:
    """A JSON string literal: mostly plain, else with escapes, non-ASCII, control bytes or empty."""
    s = rnd.choice(pool)
    return rnd.choice([
        f'"{s}"', f'"{s}"', f'"{s}"', '""', f'"{s}\\u0041"', f'"{s}\\"x"', f'"{s}\\\\"', f'"{s}\\/"',
        f'"{s}é"', f'"{s}\U0001F600"', '"\\ud83d\\ude00"', f'"{s}\t"', f'"{s}\x7f"', '"~ !#$%&()*+-./<>?@[]^_`{|}"',
    ])


def _number(rnd: random.Random) -> str:
    """A JSON number, or one of its invalid neighbours (leading zeros, a sign or a point or an exponent without
    digits, too many digits for the scanner)."""
    return rnd.choice(["0", "-0", "7", "-12", "123456789012345678", "1234567890123456789", "99999999999999999999999",
                       "01", "-", "1.5", "-2.5e3", "1e5", "1E-2", "+1", "0x10", "NaN", "Infinity", "-00",
                       "0.0", "-0.25", "1e-07", "1.25E+10", "3e999", "0.1234567890123456789", "1e1000",
                       "1.", ".5", "-.5", "1e", "1e+", "1.e5", "1.5e", "2E-", "00.5", "-01.5", "1..5", "1e5.5",
                       "1.5.5", "1ee5", "1e--5", "0x", "1f", "1d"])


ESCAPES = [r'\"', r'\\', r'\/', r'\b', r'\f', r'\n', r'\r', r'\t', r'\u0041', r'\u00e9', r'\u0000', r'\uFFFF',
           r'\u20AC', r'\ud83d\ude00']
BAD_ESCAPES = [r'\x41', r'\u12', r'\u12g4', r'\U0041', "\\'", r'\a', r'\0', r'\ ', r'\u', r'\ud800', r'\uDFFF',
               r'\u00', '\\é']


# UTF-8 in a string: well-formed, and raw bytes (each U+DC80-U+DCFF below is written as the byte 0x80-0xFF,
# _files): a lone continuation byte, overlong forms, encoded surrogates, truncated sequences, above U+10FFFF
UTF8 = ["é", "€", "\U0001F600", "\uffff", "\u0800", "\U00010000", "\U0010FFFF", "ß日本"]
BAD_UTF8 = ["\udc80", "\udcbf", "\udcc0\udcaf", "\udcc1\udcbf", "\udce0\udc80\udcaf", "\udcf0\udc80\udc80\udcaf",
            "\udced\udca0\udc80", "\udced\udcbf\udcbf", "\udce2\udc82", "\udcc3", "\udcf0\udc9f\udc98",
            "\udcf4\udc90\udc80\udc80", "\udcf5\udc80\udc80\udc80", "\udcff", "\udcc3("]


def _escaped(rnd: random.Random, pool: list[str]) -> str:
    """A string literal holding escapes or UTF-8, valid or not (an unknown letter, a short or non-hex u-escape, a backslash
    before a space or a non-ASCII character), or a backslash at its end."""
    parts = [rnd.choice(rnd.choice([ESCAPES, ESCAPES, BAD_ESCAPES, UTF8, UTF8, BAD_UTF8]))
             for _ in range(rnd.randint(1, 3))]
    text = rnd.choice(pool) + "".join(parts)
    return f'"{text}"' if rnd.random() < 0.95 else f'"{text}\\"'


def _literal(rnd: random.Random) -> str:
    return rnd.choice(["true", "false", "null", "true", "false", "null", "tru", "nul", "fals", "t", "truee",
                       "nulll", "True", "NULL", "False", "nan", "undefined"])


def _value(rnd: random.Random, pool: list[str], depth: int = 0) -> str:
    kind = rnd.random()
    if kind < 0.4:
        return _string(rnd, pool)
    if kind < 0.65:
        return _number(rnd)
    if kind < 0.75:
        return _literal(rnd)
    if kind < 0.85:
        return "[" + ",".join(_value(rnd, pool, depth + 1) for _ in range(rnd.randint(0, 2))) + "]"
    if depth > 1:
        return _string(rnd, pool)
    members = [f'{_name(rnd)}:{_value(rnd, pool, depth + 1)}' for _ in range(rnd.randint(0, 3))]
    return "{" + ",".join(members) + "}"


def _name(rnd: random.Random) -> str:
    return rnd.choice(['"query_id"', '"ad"', '"_photon"', '"x y"', '"a"', '""', '"Click_Id"', '"click_id2"',
                       '"é"', '"q\\u0041"', f'"{NAME}"', '"click\\u005fid"'])


def _line(rnd: random.Random, pool: list[str]) -> str:
    """One line: the usual shape, a strict shape of another kind, or valid or invalid JSON of any other."""
    cid, qid = rnd.choice(pool), rnd.choice(pool)
    if rnd.random() < 0.25:      # strict but for one scalar, valid or an invalid neighbour, at the top or nested
        kind = rnd.random()
        scalar = _number(rnd) if kind < 0.4 else _literal(rnd) if kind < 0.55 else _escaped(rnd, pool)
        return rnd.choice([f'{{"{NAME}":"{cid}","x":{scalar}}}', f'{{"{NAME}":"{cid}","x":{scalar},"ad":1}}',
                           f'{{"{NAME}":"{cid}","n":{{"a":"b","x":{scalar}}}}}'])
    if rnd.random() < 0.4:       # the shapes the pipeline writes
        return rnd.choice([orjson.dumps({NAME: cid, "query_id": qid, "ad": rnd.randint(0, 99)}).decode(),
                           orjson.dumps({NAME: cid, "query_id": qid, "_photon": {"region": "a", "n": 3}}).decode(),
                           orjson.dumps({NAME: cid}).decode(), f'{{"{NAME}":"{cid}","n":{{}}}}',
                           # strict but for a second top-level id field (refused), or the name nested (taken)
                           f'{{"{NAME}":"{cid}","ad":3,"{NAME}":"{qid}"}}', f'{{"{NAME}":"{cid}","{NAME}":"{cid}"}}',
                           f'{{"{NAME}":"{cid}","n":{{"{NAME}":"{qid}"}},"Click_Id":"{qid}"}}',
                           # literals and numbers with a fraction or an exponent, at the top and nested
                           f'{{"{NAME}":"{cid}","ok":true,"v":null,"x":-1.5e3,"n":{{"f":false,"p":0.25,"e":1E+2}}}}',
                           f'{{"{NAME}":"{cid}","x":{_number(rnd)},"t":{rnd.choice(["true", "tru", "null", "nul"])}}}'])
    first = f'"{NAME}":{_string(rnd, pool) if rnd.random() < 0.8 else _value(rnd, pool)}'
    members = [f"{_name(rnd)}:{_value(rnd, pool)}" for _ in range(rnd.randint(0, 4))]
    if rnd.random() < 0.15:
        rnd.shuffle(members := [first, *members])
        text = "{" + ",".join(members) + "}"
    else:
        text = "{" + ",".join([first, *members]) + "}"
    cut = rnd.random()
    if cut < 0.06:
        text = text[:rnd.randint(0, len(text))]               # torn anywhere
    elif cut < 0.09:
        text = text + rnd.choice(["x", " ", "}", ",", "\t", "{}"])
    elif cut < 0.12:
        text = rnd.choice([" ", "\t", "\ufeff", "[", ""]) + text
    elif cut < 0.15:
        text = "[" + text + "," + text + "]"                  # an array of objects: one record each
    elif cut < 0.18:
        at = rnd.randint(1, len(text) - 1)
        text = text[:at] + rnd.choice([" ", ":", ",", '"', "\\", "{", "}"]) + text[at:]
    elif cut < 0.20:
        text = rnd.choice(["", "   ", "null", "1", '"x"', "{}"])
    return text


def _files(root: Path, seed: int, n_files: int) -> list[str]:
    """``n_files`` files of 1-3 random lines each (a line per file mostly, so that a file's every line is
    the scanner's alone often enough)."""
    rnd = random.Random(seed)
    pool = [GEN.next_id() for _ in range(30)] + ["a", "a:b", "x y", "10.0.0.1:1:17640000000000001"]
    root.mkdir(parents=True, exist_ok=True)
    paths = []
    for k in range(n_files):
        lines = [_line(rnd, pool) for _ in range(rnd.choice([1, 1, 1, 2, 3]))]
        path = root / f"f-{k:05d}.jsonl"
        path.write_bytes("".join(x + "\n" for x in lines).encode("utf-8", "surrogateescape"))
        paths.append(str(path))
    return paths


@pytest.fixture(scope="module")
def scanner(spark):
    name = _scanner.function(spark)
    assert name is not None, "the scanner's class is on the test session's classpath (javac is there)"
    return name


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_the_scanner_takes_lines_only_where_its_id_is_the_json_readers(tmp_path, spark, scanner, seed):
    """File by file: where the scanner takes every line of a file, the JSON reader gives the same ids for it
    (Spark's own reader, the simple form); the files it does not take go to the JSON reader in the job."""
    from pyspark.sql import functions as F

    from photon.app._verify import FILE_KEY
    files = _files(tmp_path, seed, 300)
    scanned = spark.read.text(files).select(
        F.expr(_scanner.expression(scanner, NAME)).alias("id"), F.expr(FILE_KEY).alias("file"),
        F.col("value")).collect()
    json = spark.read.schema(f"{NAME} STRING").json(files).select(F.col(NAME).alias("id"),
                                                                  F.expr(FILE_KEY).alias("file")).collect()
    by_file, rejected, taken_lines = {}, set(), []
    for r in scanned:
        by_file.setdefault(r["file"], []).append(r["id"])
        if r["id"] is None:
            rejected.add(r["file"])
        else:
            taken_lines.append(r["value"])
    readers = {}
    for r in json:
        readers.setdefault(r["file"], []).append(r["id"])
    taken = [f for f in by_file if f not in rejected]
    for f in taken:
        assert sorted(by_file[f], key=repr) == sorted(readers.get(f, []), key=repr), (f, by_file[f], readers.get(f))
    # the world holds both kinds in number, and lines the scanner must refuse though the reader reads them
    assert len(taken) > 40 and len(rejected) > 80
    valid_refused = [r["value"] for r in scanned if r["id"] is None and r["file"] in readers
                     and len(by_file[r["file"]]) == 1 and readers[r["file"]] != [None]]
    assert len(valid_refused) > 20
    # every strict shape the scanner must take is taken: plain members, integers, one level of an object
    assert any('":{' in x for x in taken_lines) and any(re.search(r'":-?[0-9]', x) for x in taken_lines)
    assert any(re.search(r'":(true|false|null)[,}]', x) for x in taken_lines)
    assert any(re.search(r'":-?[0-9]+(\.[0-9]+)?[eE]', x) for x in taken_lines)
    assert any(re.search(r'":-?[0-9]+\.[0-9]+[,}]', x) for x in taken_lines)
    assert any("\\u" in x for x in taken_lines) and any('\\"' in x for x in taken_lines)
    assert any(ord(c) > 0x7F for x in taken_lines for c in x)
    assert any(x.endswith('"}') and x.count(":") >= 3 for x in taken_lines)


def _scan_then_json(spark, scanner, files, with_file=True):
    """The job's reading of ``files`` (photon.app._verify): the scanner, then the JSON reader for the files
    holding lines it did not take."""
    from photon.app._verify import _Lines, _Scan
    lines = _Lines(files=files)
    scan = _Scan(scanner)
    first = lines.ids(spark, NAME, with_file=with_file, scan=scan).collect()
    _, keys = scan.rejected()
    if not keys:
        return first, keys
    again = _Scan(scanner, frozenset(keys))
    rows = lines.ids(spark, NAME, with_file=with_file, scan=again).collect()
    assert again.rejected() == (0, set())
    return rows, keys


@pytest.mark.parametrize("seed", [4, 5])
def test_the_jobs_reading_with_the_scanner_gives_the_json_readers_rows(tmp_path, spark, scanner, seed):
    from photon.app._verify import _Lines
    files = _files(tmp_path, seed, 150)
    simple = sorted(map(tuple, _Lines(files=files).ids(spark, NAME, with_file=True).collect()), key=repr)
    rows, keys = _scan_then_json(spark, scanner, files)
    assert keys and len(keys) < len(files)
    assert sorted(map(tuple, rows), key=repr) == simple


def _world(root: Path, seed: int):
    """Two regions whose inputs and outputs mix files of the usual shape with files holding lines of other
    shapes (a field twice, escapes, torn lines, arrays, nested objects, numbers), some of which move the
    counts when read wrongly."""
    rnd = random.Random(seed)
    (root / "photon.toml").write_text("".join(
        f'[[regions]]\nname = "{r}"\nlog_root = "logs/{r}"\noutput_root = "out/{r}"\nstate_dir = "state/{r}"\n'
        for r in ("a", "b")))
    ids = [GEN.next_id() for _ in range(120)]
    pool = ids[:20] + ["a:b"]
    other = [GEN.next_id() for _ in range(20)]

    def usual(i):
        return orjson.dumps({NAME: i, "query_id": i, "ad": 1}).decode()

    def odd(i, output=False):
        """A line of another shape holding ``i``: valid JSON in an output (a line without a readable id
        there stops the job), anything in an input."""
        j = rnd.choice(other)
        return rnd.choice([f'{{"{NAME}":"{j}","q":1,"{NAME}":"{i}"}}',         # the last counts: i
                           f'{{"{NAME}":"{i}","{NAME}":"{j}"}}',               # j
                           f'{{"{NAME}":"{i[:5]}\\u{ord(i[5]):04x}{i[6:]}"}}',  # i, escaped
                           f'{{"{NAME}":"{i}","n":{{"{NAME}":"{j}"}}}}',         # i: nested name
                           f'{{"{NAME}":"{i}","x":1.5}}', f'{{"{NAME}" : "{i}"}}', f'{{"{NAME}":"{i}","t":true}}']
                          + ([] if output else [f'[{{"{NAME}":"{i}"}},{{"{NAME}":"{j}"}}]', f'{{"{NAME}":"{i}","x":"{j}"',
                                                f'{{"{NAME}":"{i}"}}x', _line(rnd, pool)]))

    def write(path: Path, lines):
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("".join(x + "\n" for x in lines))

    for r in ("a", "b"):
        (root / "out" / r).mkdir(parents=True, exist_ok=True)
        for k in range(4):
            chunk = ids[k * 30:(k + 1) * 30]
            lines = [usual(i) for i in chunk] if k % 2 == 0 else [odd(i) if rnd.random() < 0.3 else usual(i)
                                                                  for i in chunk]
            write(root / f"logs/{r}/clicks/w0/c-{k}.jsonl", lines)
            joined = [x if x == usual(i) else odd(i, True) for x, i in zip(lines, chunk) if rnd.random() < 0.8]
            write(root / f"out/{r}/joined/{r}-j0-1-{k:06d}.jsonl", joined + ([usual(chunk[0])] if k == 1 else []))
        write(root / f"out/{r}/unjoinable/u.jsonl", [usual(i) for i in ids[100:105]] + [odd(ids[105], True)])
        write(root / f"logs/{r}/queries/w0/q.jsonl", [orjson.dumps({"query_id": i}).decode() for i in ids])
    reg = idregistry.InMemoryRegistry()
    reg.commit(ids[:90], f"127.0.0.1:5000/1/{10**15}/1")
    idregistry.export_registry(reg, root / "export")
    return load_config(root / "photon.toml")


def _report(spark, root: Path, out: str):
    config = load_config(root / "photon.toml")
    report = run_verify(config, spark, export_dir=root / "export", out_dir=root / out)
    rows = sorted(tuple(sorted(r.items())) for r in read_recoverable(report.recoverable_path))
    d = report.as_dict()
    return d, report.duplicate_ids, rows


def _counting_jobs(monkeypatch) -> list:
    """Each run of the counts' job (photon.app._verify._counts) appends to the list given."""
    from photon.app import _verify
    runs, counts = [], _verify._counts

    def counted(*args, **kwargs):
        runs.append(1)
        return counts(*args, **kwargs)
    monkeypatch.setattr(_verify, "_counts", counted)
    return runs


@pytest.mark.parametrize("seed", [6, 9])
@pytest.mark.parametrize("sampled", [True, False])
def test_the_report_with_the_scanner_is_the_report_with_the_json_reader(tmp_path, spark, scanner, seed, sampled,
                                                                         monkeypatch, caplog):
    """With the driver's samples (each file here is shorter than a sample: every file holding a line of another
    shape goes to the JSON reader first, and the counts' job runs once), and without them (every file is
    scanned first, those the scanner rejects read again: the job runs twice), the report is the JSON
    reader's."""
    _world(tmp_path, seed)
    if not sampled:
        monkeypatch.setattr(_scanner, "sample_strict", lambda path, name, limit=0: True)
    runs = _counting_jobs(monkeypatch)
    with caplog.at_level(logging.INFO, logger="photon.verify"):
        scanned = _report(spark, tmp_path, "v1")
    assert len(runs) == (1 if sampled else 2)
    assert any("read again by Spark's JSON reader" in m for m in caplog.messages) != sampled
    assert any("Spark's JSON reader reads them" in m for m in caplog.messages) == sampled
    monkeypatch.setattr(_scanner, "function", lambda spark, class_name=None: None)
    simple = _report(spark, tmp_path, "v2")
    assert scanned == simple
    assert scanned[0]["foreign_events"] > 100 and scanned[0]["lost"] > 0 and scanned[1]


def test_mostly_other_shapes_run_the_job_once_and_a_late_other_line_runs_it_again(tmp_path, spark, scanner,
                                                                                    monkeypatch, caplog):
    """Files holding floats, true/false/null, escapes, UTF-8 text or spaces in every few lines (spaces are of
    another shape) go to the scanner or by their samples to the JSON reader (one run of the counts' job); a file strict for more than its sample and of
    another shape after it (a second id field: the last one counts) is read again (two runs); both reports
    are the JSON reader's."""
    _world(tmp_path, 11)
    rnd = random.Random(11)
    for path in sorted(tmp_path.glob("logs/*/clicks/w0/*.jsonl")) + sorted(tmp_path.glob("out/*/joined/*.jsonl")):
        lines = path.read_text().splitlines()
        extra = ['"x":1.5', '"t":true', '"n":null', r'"q":"caf\u00e9 \"x\""', '"q":"café"', r'"u":"a\/b"', '"s":"a b"']
        path.write_text("".join((x[:-1] + "," + rnd.choice(extra) + "}" if k % 3 == 0 and '"q":1,' not in x else x)
                                + "\n" for k, x in enumerate(lines)))

    def both(out):
        runs = _counting_jobs(monkeypatch)
        with caplog.at_level(logging.INFO, logger="photon.verify"):
            scanned = _report(spark, tmp_path, out + "s")
        with monkeypatch.context() as m:
            m.setattr(_scanner, "function", lambda spark, class_name=None: None)
            simple = _report(spark, tmp_path, out + "j")
        assert scanned == simple
        return len(runs) - 1, scanned

    runs, report = both("v1")
    assert runs == 1 and report[0]["foreign_events"] > 100
    assert not any("read again by Spark's JSON reader" in m for m in caplog.messages)
    assert any("Spark's JSON reader reads them" in m for m in caplog.messages)
    caplog.clear()

    late = tmp_path / "logs/a/clicks/w0/late.jsonl"
    ids = [GEN.next_id() for _ in range(2000)]
    head = [orjson.dumps({NAME: i, "query_id": i, "ad": 1, "pad": "p" * 40}).decode() for i in ids]
    assert sum(len(x) + 1 for x in head) > _scanner.SAMPLE_BYTES
    other = GEN.next_id()
    late.write_text("".join(x + "\n" for x in head) + f'{{"{NAME}":"{ids[0]}","q":1,"{NAME}":"{other}"}}\n')
    assert _scanner.sample_strict(str(late), NAME.encode())
    runs, report = both("v2")
    assert runs == 2
    assert any("read again by Spark's JSON reader" in m for m in caplog.messages)


@pytest.mark.parametrize("seed", [1, 12])
def test_the_drivers_sample_test_is_the_scanners_shape(tmp_path, spark, scanner, seed):
    """The Python test of a sample (photon.app._scanner.strict_line) takes a random line exactly where the
    scanner does (it only chooses a file's first reader, so a difference would cost a run, never an id)."""
    from pyspark.sql import functions as F
    files = _files(tmp_path, seed, 300)
    rows = spark.read.text(files).select(
        F.expr(_scanner.expression(scanner, NAME)).alias("id"),
        F.col("value").cast("binary").alias("raw")).collect()
    differ = [(bytes(r["raw"]), r["id"]) for r in rows
              if _scanner.strict_line(bytes(r["raw"]), NAME.encode()) != (r["id"] is not None)]
    assert not differ
    assert sum(r["id"] is not None for r in rows) > 40 and sum(r["id"] is None for r in rows) > 80
    for f in files:
        raw = Path(f).read_bytes()
        lines = raw.split(b"\n")[:-1]
        assert _scanner.sample_strict(f, NAME.encode()) == all(_scanner.strict_line(x, NAME.encode()) for x in lines)


def test_without_the_scanners_class_the_job_reads_with_the_json_reader(tmp_path, spark, monkeypatch, caplog):
    _world(tmp_path, 8)
    expected = _report(spark, tmp_path, "v1")
    monkeypatch.setattr(_scanner, "CLASS_NAME", "photon.NoSuchScanner")
    with caplog.at_level(logging.WARNING, logger="photon.verify"):
        assert _scanner.function(spark) is None
        assert _report(spark, tmp_path, "v2") == expected
    assert any("not on the driver's classpath" in m for m in caplog.messages)


def test_the_jar_is_compiled_once_per_source_and_jdk_and_changes_the_class_archive_and_launch(tmp_path, caplog):
    from photon.app import _class_archive, _launch
    from photon.app._spark import class_archive_plan, session_settings
    cache = tmp_path / "cache"
    jar = _scanner.jar(cache)
    assert jar is not None and jar.parent == cache
    with zipfile.ZipFile(jar) as z:
        assert "photon/PhotonStrictId.class" in z.namelist()
    stamp = jar.stat().st_mtime_ns
    assert _scanner.jar(cache) == jar and jar.stat().st_mtime_ns == stamp        # kept, not compiled again
    # another source, another jar
    source = tmp_path / "PhotonStrictId.java"
    source.write_text(_scanner.SOURCE.read_text() + "\n// changed\n")
    other = _scanner.jar(cache, source)
    assert other is not None and other != jar
    # the source hash and the JDK are the key
    java, jars = _class_archive.spark_java(), _class_archive.spark_jars()
    text = _scanner.SOURCE.read_bytes()
    assert jar.name == f"photon-scanner-{_scanner.jar_key(text, java, jars)}.jar"
    assert _scanner.jar_key(text + b" ", java, jars) != _scanner.jar_key(text, java, jars)
    # the class archive and the launch key change with the jar on the classpath
    from photon import parse_config
    cfg = parse_config({"regions": [{"name": "t", "log_root": "/x", "output_root": "/x", "state_dir": "/x"}],
                        "spark": {"cache_dir": str(cache)}})
    plain, with_jar = class_archive_plan(cfg), class_archive_plan(cfg, jar)
    if plain is not None:
        assert plain.path != with_jar.path and class_archive_plan(cfg, other).path != with_jar.path
    settings = session_settings(cfg, scanner=jar)
    assert settings["spark.driver.extraClassPath"] == str(jar)
    assert "spark.driver.extraClassPath" not in session_settings(cfg)
    own = parse_config({"regions": [{"name": "t", "log_root": "/x", "output_root": "/x", "state_dir": "/x"}],
                        "spark": {"conf": {"spark.driver.extraClassPath": "/opt/mine.jar"}}})
    assert session_settings(own, scanner=jar)["spark.driver.extraClassPath"] == f"/opt/mine.jar:{jar}"
    env = {"PATH": "/usr/bin"}
    assert _launch.launch_key(settings, env) != _launch.launch_key(session_settings(cfg), env)
    # no javac: no jar, a log line; a source that does not compile: no jar, a log line
    caplog.set_level(logging.WARNING, logger="photon.verify")
    real = _scanner._javac
    _scanner._javac = lambda java: None
    try:
        assert _scanner.jar(tmp_path / "c2") is None
    finally:
        _scanner._javac = real
    assert any("no javac" in m for m in caplog.messages)
    source.write_text("package photon; class Broken {")
    assert _scanner.jar(tmp_path / "c3", source) is None
    assert any("compiling the strict-shape scanner failed" in m for m in caplog.messages)
    assert not list((tmp_path / "c3").glob("*.jar"))
