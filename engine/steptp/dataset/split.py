"""``stp split``: a held-out split that holds (issue 51; paper §4.3: the test programs are
"strictly held out from training").

**Provenance.** Every dictionary entry records its source program
(:func:`program_type`, ``program_id``; :func:`steptp.dataset.generate._entry`) and every chat
record carries both in its ``meta`` (:func:`steptp.dataset.chat._meta`):

* ``program_type``: the corpus type named in the header of an ``stp corpus`` program
  (``# type: AvgPool3d``), else the program's name (its signature name: hand-written and
  other programs are each a type of their own);
* ``program_id``: the source program's content key (:class:`steptp.programs.Source` ``key``:
  SHA256 of the file's bytes, 16 hex digits), the key of its resume record; a derived original
  (round 2 and later, follow-ups) carries the id of the source program it comes from, so all
  rounds of one program share it.

**The split** (:func:`make_split`): whole program types are held out. The types are ordered by
a seeded shuffle (:func:`steptp.seeds.seeded_rng` ``(seed, "split")`` over the sorted type
names) and taken in that order whenever a type brings the test records closer to
``test_fraction`` of all chat records (single- and multi-answer together); at least one type
is held out and at least one is kept.

**The leak check**, before anything is written. A train record leaks when

1. its program type is a test type;
2. its prompt (the user message text) is the prompt of a test record;
3. its original program or the program of one of its answers is alpha-equivalent
   (:func:`steptp.dataset.labels.program_key` of the LEIR, the signature's tensor names kept)
   to a test program: the original or an answer's program of a test record, a held-out source
   program, or a test case of ``testset/``. So no program occurs on both sides, up to renaming
   loop variables and intermediate tensors.

A leaking record's type is moved to the test side too (never dropped: the test side stays whole
types), and the check runs again until nothing leaks; the moves are listed with their reason.
Then it is counted once more, independently: types, prompts, alpha-equivalent programs and
test cases found in train (exactly, as ``stp testset --exclude`` looks, or up to renaming) must
all be 0 (:class:`LeakError` otherwise, which the construction rules out).

**The test cases** (``OUT/testset/``): :func:`steptp.dataset.testset.build_testset` on the held-out
source programs (dtype variants and, for corpus programs, shape variants), with the train
records' entries as its ``exclude``. A source file that is no longer where the dataset found it
(or whose bytes changed) is replaced by its original LEIR from the dictionary (dtype variants
only); ``testset.json`` names the dataset's source path and says ``"from": "dictionary"``.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import tempfile
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from pathlib import Path

from .labels import known_names, program_key
from .provenance import file_key, program_type, provenance  # noqa: F401  (re-exported)

#: The files that make a directory an ``stp dataset`` output directory (for ``stp split``).
DATASET_FILES = ("run.json", "dictionary.jsonl", "chat_single.jsonl", "chat_multi.jsonl")
DEFAULT_TEST_FRACTION = 0.1


class SplitError(ValueError):
    """Bad input for ``stp split`` (not a dataset, an empty one, a fraction outside (0, 1), a
    non-empty output directory, too few program types): exit 2."""


class LeakError(RuntimeError):
    """The final leak check found a test program, prompt or type in train: exit 1, nothing written."""


# ---------------------------------------------------------------------------------------------
# the dataset
# ---------------------------------------------------------------------------------------------


@dataclass
class _Record:
    rec: dict                  # the chat record (meta completed with program_type / program_id)
    file: str                  # chat_single.jsonl / chat_multi.jsonl
    line: int
    kind: str
    ptype: str
    pid: str
    prompt: str
    original: str              # program_key of the original
    programs: set = field(default_factory=set)  # program_key of the original and every answer


@dataclass
class _Dataset:
    path: Path
    run: dict
    entries: list[dict]
    by_id: dict[str, dict]
    records: list[_Record]
    prov: dict[str, tuple[str, str]]    # entry id -> (program_type, program_id)


_KEYS: dict[tuple[str, frozenset], str] = {}


def _alpha(text: str, known: frozenset) -> str:
    """:func:`steptp.dataset.labels.program_key`, memoised; text that does not parse is its own
    key (stripped), so an unparsable program still counts exactly."""
    k = (text, known)
    if k not in _KEYS:
        try:
            _KEYS[k] = program_key(text, known)
        except Exception:  # noqa: BLE001 - compared as text instead
            _KEYS[k] = text.strip()
    return _KEYS[k]


def _read(path: Path):
    from ..io import read_jsonl_lines

    try:
        return list(read_jsonl_lines(path))
    except ValueError as e:
        raise SplitError(str(e)) from None
    except OSError as e:
        raise SplitError(f"{path}: cannot read: {e.strerror or e}") from None


def load_dataset_dir(dataset) -> _Dataset:
    """The entries and chat records of an ``stp dataset`` output directory, each record with its
    program type and id. Raises :class:`SplitError` for anything that is not one, or an empty one."""
    d = Path(dataset)
    if not d.exists():
        raise SplitError(f"{d}: no such directory")
    if not d.is_dir():
        raise SplitError(f"{d}: not a directory (expected an stp dataset output directory)")
    missing = [n for n in DATASET_FILES if not (d / n).is_file()]
    if missing:
        raise SplitError(f"{d}: not an stp dataset output directory (no {', '.join(missing)})")
    try:
        run = json.loads((d / "run.json").read_text(encoding="utf-8"))
    except (ValueError, UnicodeDecodeError, OSError) as e:
        raise SplitError(f"{d / 'run.json'}: not a run description ({e})") from None
    if not isinstance(run, dict):
        raise SplitError(f"{d / 'run.json'}: not a run description (expected a JSON object)")
    entries, by_id = [], {}
    for line, e in _read(d / "dictionary.jsonl"):
        ok = (isinstance(e, dict) and isinstance(e.get("id"), str) and isinstance(e.get("original"), dict)
              and isinstance(e["original"].get("leir"), str) and isinstance(e.get("transformed"), dict)
              and isinstance(e["transformed"].get("leir"), str) and isinstance(e.get("signature"), dict)
              and isinstance(e["signature"].get("tensors"), list))
        if not ok:
            raise SplitError(f"{d / 'dictionary.jsonl'}:{line}: not a dictionary entry")
        entries.append(e)
        by_id[e["id"]] = e
    # the program of each entry: its own fields; entries written before them get the resume
    # record's key (state.jsonl lists every entry id of a program, all rounds) and the type of
    # their source file's header, else their name
    state_key = {}
    for _, s in _read(d / "state.jsonl"):
        if isinstance(s, dict) and isinstance(s.get("key"), str):
            for i in s.get("ids") or ():
                state_key[i] = s["key"]
    prov = {}
    for e in entries:
        ptype, pid = e.get("program_type"), e.get("program_id")
        if ptype is None or pid is None:
            t2, i2 = provenance(e)
            ptype = ptype if ptype is not None else t2
            pid = pid or state_key.get(e["id"]) or i2 or \
                "path:" + hashlib.sha256(str(e.get("source")).encode()).hexdigest()[:16]
        prov[e["id"]] = (str(ptype), str(pid))
    records = []
    for name, kind in (("chat_single.jsonl", "single"), ("chat_multi.jsonl", "multi")):
        for line, r in _read(d / name):
            where = f"{d / name}:{line}"
            meta = r.get("meta") if isinstance(r, dict) else None
            msgs = r.get("messages") if isinstance(r, dict) else None
            if not isinstance(meta, dict) or not isinstance(msgs, list) or not meta.get("entry_ids"):
                raise SplitError(f"{where}: not a chat record (messages and meta.entry_ids)")
            prompt = next((m.get("content") for m in msgs if isinstance(m, dict) and m.get("role") == "user"), None)
            if not isinstance(prompt, str):
                raise SplitError(f"{where}: no user message")
            try:
                es = [by_id[i] for i in meta["entry_ids"]]
            except (KeyError, TypeError):
                raise SplitError(f"{where}: names an entry that is not in dictionary.jsonl") from None
            ptype, pid = meta.get("program_type"), meta.get("program_id")
            if ptype is None or pid is None:
                ptype, pid = prov[es[0]["id"]]
            meta = {**meta, "kind": meta.get("kind", kind), "program_type": ptype, "program_id": pid}
            known = known_names(es[0])
            orig = _alpha(es[0]["original"]["leir"], known)
            progs = {orig} | {_alpha(e["original"]["leir"], known_names(e)) for e in es[1:]} | \
                {_alpha(e["transformed"]["leir"], known_names(e)) for e in es}
            records.append(_Record({**r, "meta": meta}, name, line, meta["kind"], str(ptype), str(pid), prompt,
                                   orig, progs))
    if not records:
        raise SplitError(f"{d}: empty dataset (no chat records in chat_single.jsonl or chat_multi.jsonl)")
    return _Dataset(d, run, entries, by_id, records, prov)


# ---------------------------------------------------------------------------------------------
# the split
# ---------------------------------------------------------------------------------------------


def choose_types(counts: dict[str, int], seed: int, fraction: float) -> list[str]:
    """The seeded choice of held-out types (module docstring): ``counts`` are chat records per
    type; returns the chosen types in the order they were drawn."""
    from ..seeds import seeded_rng

    order = sorted(counts)
    seeded_rng(seed, "split").shuffle(order)
    target = fraction * sum(counts.values())
    chosen: list[str] = []
    n = 0
    for t in order:
        if len(chosen) + 1 >= len(order):
            break  # keep a type for training
        if abs(n + counts[t] - target) < abs(n - target):
            chosen.append(t)
            n += counts[t]
    if not chosen:
        chosen.append(order[0])
    return chosen


def _source_entries(ds: _Dataset, types: set[str]) -> dict[str, dict]:
    """program_id -> the first entry of that source program (not derived) of ``types``, in
    dictionary order."""
    out: dict[str, dict] = {}
    for e in ds.entries:
        ptype, pid = ds.prov[e["id"]]
        if ptype in types and not e.get("derived_from") and pid not in out:
            out[pid] = e
    return out


def _test_programs(ds: _Dataset, test: set[str], cases: dict[str, str]) -> dict[str, str]:
    """Alpha key -> what it is (for messages) of every test program: the original of a test
    record, a held-out source program, a test case."""
    progs: dict[str, str] = {}
    for r in ds.records:
        if r.ptype in test:
            progs.setdefault(r.original, f"the original of {r.file}:{r.line} ({r.ptype})")
            for k in sorted(r.programs - {r.original}):
                progs.setdefault(k, f"an answer's program of {r.file}:{r.line} ({r.ptype})")
    for pid, e in _source_entries(ds, test).items():
        progs.setdefault(_alpha(e["original"]["leir"], known_names(e)),
                         f"held-out program {e.get('source')} ({ds.prov[e['id']][0]})")
    for key, what in cases.items():
        progs.setdefault(key, what)
    return progs


def _leaks(ds: _Dataset, test: set[str], cases: dict[str, str]) -> list[dict]:
    """Every train record that leaks (module docstring), with the first reason found."""
    test_prompts = {r.prompt: r for r in ds.records if r.ptype in test}
    progs = _test_programs(ds, test, cases)
    out = []
    for r in ds.records:
        if r.ptype in test:
            continue
        where = f"{r.file}:{r.line}"
        if r.prompt in test_prompts:
            o = test_prompts[r.prompt]
            out.append({"type": r.ptype, "record": where, "rule": "prompt",
                        "reason": f"its prompt is that of {o.file}:{o.line} ({o.ptype})"})
            continue
        hit = next((k for k in sorted(r.programs) if k in progs), None)
        if hit is not None:
            what = "its original" if hit == r.original else "an answer's program"
            out.append({"type": r.ptype, "record": where, "rule": "alpha_equivalent",
                        "reason": f"{what} is alpha-equivalent to {progs[hit]}"})
    return out


def _close(ds: _Dataset, test: set[str], cases: dict[str, str], moved: list[dict]) -> None:
    """Move the type of every leaking train record to ``test`` until nothing leaks."""
    while True:
        leaks = _leaks(ds, test, cases)
        if not leaks:
            return
        for leak in leaks:
            if leak["type"] not in test:
                test.add(leak["type"])
                moved.append(leak)


def _resolve_source(ds: _Dataset, entry: dict, pid: str) -> Path | None:
    """The source file of a held-out program, where the dataset found it (relative to the
    current directory, else to the dataset's parent) and with the same bytes; else None."""
    src = entry.get("source")
    if not src:
        return None
    p = Path(src)
    for cand in ([p] if p.is_absolute() else [p, ds.path.resolve().parent / p]):
        if cand.is_file() and file_key(cand) == pid:
            return cand
    return None


def _testset(ds: _Dataset, test: set[str], train_entries: list[dict], outdir: Path, variants: int,
             progress: bool) -> tuple[dict, dict[str, str]]:
    """Build ``outdir`` (``stp testset``'s format) for the held-out source programs; returns
    its manifest and the alpha key of every case (-> a description)."""
    from .testset import build_testset
    from ..io import write_jsonl_atomic
    from ..leir.fileformat import LeirModule, load_leir, save_leir
    from ..leir.parser import parse_program
    from .chat import signature_of
    from .labels import module_key

    with tempfile.TemporaryDirectory(prefix="stp-split-") as tmp:
        t = Path(tmp)
        write_jsonl_atomic(t / "train" / "dictionary.jsonl", train_entries)
        inputs, origin = [], {}
        for n, (pid, e) in enumerate(_source_entries(ds, test).items()):
            path = _resolve_source(ds, e, pid)
            if path is None:
                # the source is not where the dataset found it: its original from the dictionary
                stem = Path(str(e.get("source") or e.get("program") or pid)).stem
                path = t / "src" / str(n) / f"{stem}.leir"
                path.parent.mkdir(parents=True)
                save_leir(LeirModule(signature_of(e["signature"]), parse_program(e["original"]["leir"])), path)
                origin[str(path)] = (str(e.get("source")), "dictionary")
            else:
                origin[str(path)] = (str(e.get("source")), "source")
            inputs.append(str(path))
        m = build_testset(inputs, outdir, variants=variants, exclude=t / "train", allow_overlap=True,
                          progress=progress)
    m["inputs"] = [origin[i][0] for i in m["inputs"]]
    m["exclude"] = "the train split"
    for row in m["cases"]:
        src, how = origin.get(row["source"], (row["source"], "source"))
        row["source"], row["from"] = src, how
    for f in m["failed"]:
        f["source"] = origin.get(f["source"], (f["source"],))[0]
    for o in m["overlap"]:
        o["source"] = origin.get(o["source"], (o["source"],))[0]
    (outdir / "testset.json").write_text(json.dumps(m, indent=2) + "\n")
    cases = {}
    for row in m["cases"]:
        mod = load_leir(outdir / row["file"])
        cases.setdefault(module_key(mod), f"test case testset/{row['file']}")
    return m, cases


def _count_leaks(ds: _Dataset, test: set[str], cases: dict[str, str], manifest: dict) -> dict:
    """The final, independent count of the leak check."""
    train = [r for r in ds.records if r.ptype not in test]
    test_recs = [r for r in ds.records if r.ptype in test]
    progs = _test_programs(ds, test, {})
    train_progs = set().union(*(r.programs for r in train)) if train else set()
    test_prompts = {r.prompt for r in test_recs}
    return {
        "types": len({r.ptype for r in train} & {r.ptype for r in test_recs}),
        "prompts": sum(1 for r in train if r.prompt in test_prompts),
        "alpha_equivalent_programs": sum(1 for r in train if r.programs & set(progs)),
        "testset_cases": sum(1 for k in cases if k in train_progs) + sum(1 for c in manifest["cases"]
                                                                          if c.get("in_training")),
        "checked": {"train_records": len(train), "test_records": len(test_recs), "test_prompts": len(test_prompts),
                    "test_programs": len(progs), "train_programs": len(train_progs), "testset_cases": len(cases)},
    }


def make_split(dataset, outdir, seed: int, test_fraction: float = DEFAULT_TEST_FRACTION, variants: int = 3,
               progress: bool = False) -> dict:
    """Split the chat records of ``dataset`` (an ``stp dataset`` output directory) into
    ``OUT/train.jsonl`` and ``OUT/test.jsonl`` by program type, with ``OUT/testset/`` (the
    held-out programs' test cases), ``OUT/split.json`` (returned) and ``OUT/README.md`` (a data
    set card). Raises :class:`SplitError` for bad input and :class:`LeakError` when the final
    check finds a leak; nothing is written then."""
    if not (0.0 < test_fraction < 1.0):
        raise SplitError(f"--test-fraction {test_fraction}: expected a number between 0 and 1 (exclusive)")
    if variants < 1:
        raise SplitError(f"--variants {variants}: expected at least 1")
    out = Path(outdir)
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise SplitError(f"{out}: exists and is not an empty directory (choose a new output directory)")
    ds = load_dataset_dir(dataset)
    counts = Counter(r.ptype for r in ds.records)
    if len(counts) < 2:
        raise SplitError(f"{ds.path}: holds one program type ({next(iter(counts))}); "
                         "a held-out split needs two or more")
    chosen = choose_types(counts, seed, test_fraction)
    test = set(chosen)
    moved: list[dict] = []
    cases: dict[str, str] = {}
    with tempfile.TemporaryDirectory(prefix="stp-split-out-") as tmp:
        ts_dir = Path(tmp) / "testset"
        for _ in range(len(counts) + 1):
            _close(ds, test, cases, moved)
            if len(test) >= len(counts):
                break
            train_entries = _entries_of([r for r in ds.records if r.ptype not in test], ds)
            if ts_dir.exists():
                shutil.rmtree(ts_dir)
            manifest, cases = _testset(ds, test, train_entries, ts_dir, variants, progress)
            if not _leaks(ds, test, cases):
                break
        if len(test) >= len(counts):
            raise SplitError(f"{ds.path}: every program type leaks into the held-out ones (alpha-equivalent "
                             f"programs or equal prompts across types); no training records would be left")
        leaks = _count_leaks(ds, test, cases, manifest)
        bad = {k: v for k, v in leaks.items() if k != "checked" and v}
        if bad:
            raise LeakError(f"leak check failed: {', '.join(f'{k} {v}' for k, v in bad.items())}; nothing written")
        train = [r for r in ds.records if r.ptype not in test]
        tests = [r for r in ds.records if r.ptype in test]
        summary = _summary(ds, seed, test_fraction, variants, chosen, test, moved, train, tests, leaks, manifest)
        out.mkdir(parents=True, exist_ok=True)
        from ..io import write_json_atomic, write_jsonl_atomic, write_text_atomic

        write_jsonl_atomic(out / "train.jsonl", (r.rec for r in train))
        write_jsonl_atomic(out / "test.jsonl", (r.rec for r in tests))
        shutil.copytree(ts_dir, out / "testset")
        write_json_atomic(out / "split.json", summary)
        write_text_atomic(out / "README.md", card(summary, ds.run, train, tests))
    return summary


def _entries_of(records: list[_Record], ds: _Dataset) -> list[dict]:
    seen, out = set(), []
    for r in records:
        for i in r.rec["meta"]["entry_ids"]:
            if i not in seen:
                seen.add(i)
                out.append(ds.by_id[i])
    return out


def _items(records: list[_Record], what: str) -> Counter:
    return Counter(x for r in records for x in r.rec["meta"].get(what) or ())


def _summary(ds, seed, fraction, variants, chosen, test, moved, train, tests, leaks, manifest) -> dict:
    total = len(train) + len(tests)
    rec_types = {r.ptype for r in ds.records}
    entry_types = {p[0] for p in ds.prov.values()}
    return {
        "dataset": str(ds.path),
        "seed": seed,
        "test_fraction": fraction,
        "variants": variants,
        "records": {"total": total, "train": len(train), "test": len(tests),
                    "test_share": round(len(tests) / total, 4)},
        "by_kind": {"train": dict(sorted(Counter(r.kind for r in train).items())),
                    "test": dict(sorted(Counter(r.kind for r in tests).items()))},
        "types": {"total": len(rec_types), "train": len({r.ptype for r in train}), "test": len(test)},
        "programs": {"train": len({r.pid for r in train}), "test": len({r.pid for r in tests})},
        "chosen_types": chosen,
        "moved_types": moved,
        "held_out_types": sorted(test),
        "train_types": sorted({r.ptype for r in train}),
        "types_without_records": sorted(entry_types - rec_types),
        "leak_check": {"passed": True, **leaks,
                       "rules": ["no test program type in train", "no test prompt (user message) in train",
                                 "no train program (an original or an answer) alpha-equivalent to a test program "
                                 "(an original or an answer of a test record, a held-out source program, a test "
                                 "case)",
                                 "no test case in the train dictionary entries (stp testset --exclude)"],
                       "resolution": "a leaking train record's type is moved to test (moved_types)"},
        "testset": {"dir": "testset", "cases": len(manifest["cases"]), "programs": len(manifest["inputs"]),
                    "from_source": sum(1 for c in manifest["cases"] if c.get("from") == "source"),
                    "from_dictionary": sum(1 for c in manifest["cases"] if c.get("from") == "dictionary"),
                    "failed": manifest["failed"]},
    }


# ---------------------------------------------------------------------------------------------
# the data set card
# ---------------------------------------------------------------------------------------------


def _license() -> str:
    """The Hugging Face license id of the package's license (pyproject), else apache-2.0."""
    try:
        import tomllib

        root = Path(__file__).resolve().parents[3]
        lic = tomllib.loads((root / "pyproject.toml").read_text(encoding="utf-8"))["project"]["license"]
        lic = lic.get("text") if isinstance(lic, dict) else lic
        return str(lic).strip().lower() or "apache-2.0"
    except Exception:  # noqa: BLE001 - an installed package without its pyproject
        return "apache-2.0"


def _size_category(n: int) -> str:
    for bound, name in ((1_000, "n<1K"), (10_000, "1K<n<10K"), (100_000, "10K<n<100K"),
                        (1_000_000, "100K<n<1M")):
        if n < bound:
            return name
    return "1M<n<10M"


def _pct(n: int, total: int) -> str:
    return f"{100 * n / total:.1f} %" if total else "-"


def _names(xs, most: int = 40) -> str:
    xs = list(xs)
    text = ", ".join(f"`{x}`" for x in xs[:most])
    return text + (f" and {len(xs) - most} more" if len(xs) > most else "") if xs else "none"


#: run.json field -> (``stp dataset`` flag, its default: not repeated on the command line)
_FLAGS = {"seed": ("--seed", None), "trials": ("--trials", 3), "per_rule": ("--per-rule", 1),
          "max_tries": ("--max-tries", 4), "timeout_s": ("--timeout", 60.0), "rounds": ("--rounds", 1),
          "device": ("--device", "cpu")}


def _command(run: dict) -> str:
    """The ``stp dataset`` command line that run.json describes (inputs elided)."""
    args = ["stp dataset INPUTS -o DATASET"]
    for k, (flag, default) in _FLAGS.items():
        if k in run and run[k] != default:
            args.append(f"{flag} {run[k]}")
    args += [f"--rule {r}" for r in run.get("rule_paths") or ()]
    if run.get("with_cuda") is False:
        args.append("--no-cuda")
    if run.get("nvcc") is False:
        args.append("--no-nvcc")
    if run.get("isolated") is False:
        args.append("--in-process")
    for k, flag in (("time", "--time"), ("negatives", "--negatives"), ("follow_ups", "--follow-ups")):
        if run.get(k):
            args.append(flag)
    pol = run.get("policy") or {}
    if pol.get("profile"):
        args.append(f"--profile {pol['profile']}")
    if pol.get("max_tokens"):
        args.append(f"--max-tokens {pol['max_tokens']}")
    return " ".join(args)


def card(summary: dict, run: dict, train: list[_Record], tests: list[_Record]) -> str:
    """``README.md``: a Hugging Face data set card (YAML front matter, then composition,
    fields, how it was made, the split, limitations)."""
    total = summary["records"]["total"]
    every = train + tests
    L = ["---", f"license: {_license()}", "pretty_name: Step-TP step-level LEIR transformations", "language:", "- en",
         "task_categories:", "- text-generation", "tags:", "- code", "- compilers", "- tensor-programs", "- leir",
         "- step-tp", "size_categories:", f"- {_size_category(total)}", "configs:", "- config_name: default",
         "  data_files:", "  - split: train", "    path: train.jsonl", "  - split: test", "    path: test.jsonl",
         "---", "",
         "# Step-TP: step-level LEIR transformations", "",
         "Verified single optimisation steps on tensor programs written in LEIR, a loop-equation IR "
         "(the Step-TP paper, §3.4), as chat records for supervised fine-tuning: the user gives a program, "
         "the assistant answers `<think>CoT</think><answer>JSON</answer>` with the transformed program "
         "(`transformed_IR`) and the strategy applied (`applied_strategy`); multi-answer records ask for "
         "several different steps at once. Every answer passed Diff / Build / Exec / Equal verification. "
         f"The test split holds out whole program types (seed {summary['seed']}); `testset/` holds the "
         "held-out programs' evaluation cases (§4.3).", "",
         "## Composition", "",
         "| | train | test | total |", "|---|---:|---:|---:|"]

    def row(name, f):
        a, b = f(train), f(tests)
        L.append(f"| {name} | {a:,} | {b:,} | {a + b:,} |")

    row("records", len)
    row("single-answer records", lambda rs: sum(1 for r in rs if r.kind == "single"))
    row("multi-answer records", lambda rs: sum(1 for r in rs if r.kind == "multi"))
    row("answers (steps)", lambda rs: sum(len(r.rec["meta"]["entry_ids"]) for r in rs))
    row("source programs", lambda rs: len({r.pid for r in rs}))
    row("program types", lambda rs: len({r.ptype for r in rs}))
    levels = _items(every, "levels")
    n_items = sum(levels.values())
    L += ["", "Answers per difficulty level (paper Eq. 1; a multi-answer record's answers counted singly):", "",
          "| level | train | test | total | share |", "|---|---:|---:|---:|---:|"]
    lt, ls = _items(train, "levels"), _items(tests, "levels")
    for lvl in sorted(levels, key=lambda x: ("difficult", "medium", "easy").index(x) if x in
                      ("difficult", "medium", "easy") else 3):
        L.append(f"| {lvl} | {lt[lvl]:,} | {ls[lvl]:,} | {levels[lvl]:,} | {_pct(levels[lvl], n_items)} |")
    strat = _items(every, "strategies")
    st, ss = _items(train, "strategies"), _items(tests, "strategies")
    L += ["", f"Answers per strategy, the 10 most frequent of {len(strat)}:", "",
          "| strategy | train | test | total | share |", "|---|---:|---:|---:|---:|"]
    for s, n in sorted(strat.items(), key=lambda kv: (-kv[1], kv[0]))[:10]:
        L.append(f"| `{s}` | {st[s]:,} | {ss[s]:,} | {n:,} | {_pct(n, n_items)} |")
    L += ["", "## Fields", "",
          "One schema for both splits and both kinds (ms-swift `messages` plus `meta`):", "",
          "* `messages`: `[{role: user, content}, {role: assistant, content}]`; the user turn is the prompt "
          "(`templates/prompt_single.j2` / `prompt_multi.j2`), the assistant turn the label "
          "`<think>...</think><answer>JSON</answer>` (`transformed_IR`, `applied_strategy`; a list with `idx` "
          "for multi-answer records).",
          "* `meta.kind`: `single` or `multi`.",
          "* `meta.entry_ids`, `meta.strategies`, `meta.levels`: per answer, in order, the dictionary entry id "
          "(`dictionary.jsonl` of the dataset), the strategy (rule id) and its difficulty level.",
          "* `meta.program_type`: the source program's type (the `stp corpus` type of its header, else its name); "
          "the unit the split holds out.",
          "* `meta.program_id`: the source program's content key (SHA256 of its file, 16 hex digits); every round "
          "of a program (derived originals) shares it.", "",
          "```python",
          "from datasets import load_dataset",
          "ds = load_dataset(\"json\", data_files={\"train\": \"train.jsonl\", \"test\": \"test.jsonl\"})",
          "```", "",
          "## How it was made", "",
          "Programs (KernelBench-style PyTorch programs from `stp corpus`, hand-written PyTorch and LEIR programs) "
          "were translated to LEIR and checked against PyTorch; every rule that matches was applied, and each "
          "candidate step kept only when it passed Diff (the program changed), Build (the TVM CPU build"
          + (", and `nvcc --ptx` of its CUDA source" if run.get("nvcc", True) else "") + "), Exec and Equal: "
          f"the same outputs as the original on {run.get('trials', 3)} random + 2 ordered + 4 edge-case trials "
          "(exact zeros, scattered zeros, all negative, large magnitudes), within the dtype's tolerance. One step "
          "keeps one label (the lowest-difficulty strategy among those giving it). The chat records are the "
          "dataset's `chat_single.jsonl` and `chat_multi.jsonl` (difficulty-aware filtering, §3.4).", "",
          "`stp dataset` options (the dataset's `run.json`):", "",
          "```sh", _command(run), "```", "",
          "| option | value |", "|---|---|"]
    for k, v in run.items():
        if k == "rule_hashes":
            continue
        L.append(f"| `{k}` | `{json.dumps(v, ensure_ascii=False)}` |")
    lk = summary["leak_check"]
    ck = lk["checked"]
    ts = summary["testset"]
    L += ["", "## The split", "",
          f"Whole program types are held out: a seeded choice (`stp split --seed {summary['seed']} --test-fraction "
          f"{summary['test_fraction']}`) of types whose records are about {summary['test_fraction']:.0%} of all "
          f"records; the test split holds {summary['records']['test']:,} of {total:,} records "
          f"({summary['records']['test_share']:.1%}), {summary['types']['test']} of {summary['types']['total']} "
          "types.", "",
          f"* Held-out types ({len(summary['held_out_types'])}): {_names(summary['held_out_types'])}.",
          f"* Drawn by the seed: {_names(summary['chosen_types'])}."]
    if summary["moved_types"]:
        L.append(f"* Moved to test by the leak check ({len(summary['moved_types'])}):")
        L += [f"  * `{m['type']}`: {m['record']}: {m['reason']}" for m in summary["moved_types"]]
    else:
        L.append("* Moved to test by the leak check: none.")
    L += ["", "Leak check (before writing; `split.json` `leak_check`):", "",
          "| what may not occur in train | found | checked |", "|---|---:|---|",
          f"| a test program type | {lk['types']} | {summary['types']['train']} train types |",
          f"| a test prompt (user message text) | {lk['prompts']} | {ck['test_prompts']} test prompt(s) |",
          f"| a program (original or answer) alpha-equivalent to a test program (original or answer; loop "
          f"variables and intermediates renamed) | {lk['alpha_equivalent_programs']} | "
          f"{ck['test_programs']} test programs against {ck['train_programs']} train programs |",
          f"| a test case of `testset/` (exactly or up to renaming) | {lk['testset_cases']} | "
          f"{ck['testset_cases']} cases |", "",
          f"`testset/` ({ts['cases']} case(s) from {ts['programs']} held-out program(s); `stp testset` format, "
          "for `stp eval testset`): dtype variants (f16/f32/f64) of every held-out source program and, for "
          "`stp corpus` programs, shape variants (the type redrawn with other seeds)"
          + (f"; {ts['from_dictionary']} cases come from the dictionary's LEIR because their source file was "
             "not found (dtype variants only)" if ts["from_dictionary"] else "") + ".", "",
          "## Limitations", "",
          "* Synthetic programs: the corpus composes PyTorch operators by type with seeded shapes; it is not a "
          "sample of real models. Hand-written programs are each a type of their own.",
          "* Holding out types is not holding out operators: a held-out type shares operators (and so step "
          "patterns) with training types; only the whole program, its prompt and alpha-equivalent programs "
          "are kept out.",
          "* Verification is testing, not proof: equal outputs on the trials above (plus a bounded symbolic "
          "check for algebraic steps), on the CPU build; "
          + ("the CUDA source is compiled, not run." if run.get("nvcc", True) and run.get("with_cuda", True)
             else "this run neither compiled nor ran CUDA code (`--no-nvcc` / `--no-cuda`)."),
          "* The strategy names are the shipped rules'; a step reachable by several rules carries one name.",
          "* Records per split follow the program types, so the test share is only about the fraction asked "
          "for, and more where the leak check moved types.", ""]
    return "\n".join(L)


__all__ = ["DATASET_FILES", "DEFAULT_TEST_FRACTION", "SplitError", "LeakError", "program_type", "file_key",
           "provenance", "load_dataset_dir", "choose_types", "make_split", "card"]
