"""Per-function profiles: cachegrind's files of real processes read per function (C++ names
demangled), a region's profile as the difference of its two marks, the diff of two sides, and
the explanation every reader shows (functions that grew, or operators), escaped where shown."""

from __future__ import annotations

import json
import subprocess

import pytest

from abwatch.runners import profiles
from abwatch.runners.counters import COUNTERS
from abwatch.runners.profiles import Profile, grew, read_cg, short_name, subtract, top
from abwatch.service.notify.explained import markdown_lines, text_lines
from abwatch.service.notify.pull_answer import _cell
from abwatch.service.store.explain import explain

# a region between two forked marks, as runners/worker/region.py marks a TVM worker's compile:
# work() runs `argv[1]` times inside it, once outside; helper() only outside
CPP = r"""
#include <cstdio>
#include <cstdlib>
#include <sys/wait.h>
#include <unistd.h>
namespace ns {
template <class T> struct Grower {
    T seed;
    __attribute__((noinline)) T work(long n) { volatile T s = seed; for (long i = 0; i < n; i++) s = s * 3 + i; return s; }
};
}
__attribute__((noinline)) static long helper(long n) { volatile long s = 0; for (long i = 0; i < n; i++) s += i; return s; }
static int mark() { pid_t pid = fork(); if (pid == 0) _exit(0); waitpid(pid, nullptr, 0); return pid; }
int main(int argc, char **argv) {
    ns::Grower<long> g{1};
    long outside = helper(50000) + g.work(1000);
    int start = mark();
    long inside = g.work(atol(argv[1]));
    int end = mark();
    printf("{\"marks\": [%d, %d], \"x\": %ld}\n", start, end, outside + inside);
    return 0;
}
"""
WORK = "ns::Grower<long>::work(long)"


@pytest.fixture(scope="module")
def grower(tmp_path_factory):
    where = tmp_path_factory.mktemp("grower")
    (where / "grower.cpp").write_text(CPP)
    subprocess.run(["g++", "-O1", "-o", str(where / "grower"), str(where / "grower.cpp")], check=True)
    return where / "grower"


def _region(grower, n: int, scratch) -> tuple[int, Profile | None]:
    scratch.mkdir()
    valgrind = COUNTERS["valgrind"]
    out = subprocess.run(valgrind.region_argv([str(grower), str(n)], scratch), check=True, capture_output=True,
                         text=True)
    reported = json.loads(out.stdout)
    return valgrind.read_region(scratch, reported), valgrind.region_profile(scratch, reported)


def test_a_cachegrind_file_is_read_per_function_with_cpp_names_demangled(grower, tmp_path):
    valgrind = COUNTERS["valgrind"]
    scratch = tmp_path / "whole"
    scratch.mkdir()
    subprocess.run(valgrind.wrap([str(grower), "20000"], scratch), check=True, capture_output=True)
    files = sorted(scratch.glob("cg.*"))
    assert len(files) == 3  # the process and its two marks (children are followed)
    counts = read_cg(max(files, key=lambda p: p.stat().st_size))
    assert WORK in counts and "helper(long)" in counts  # cachegrind demangles; no _ZN... left
    assert not [name for name in counts if name.startswith("_ZN")]
    summary = next(int(line.split()[1]) for line in max(files, key=lambda p: p.stat().st_size).read_text()
                   .splitlines() if line.startswith("summary:"))
    assert sum(counts.values()) == summary  # every instruction is some function's
    whole = valgrind.profile(scratch)
    assert whole is not None and whole.total == valgrind.read(scratch)  # the processes together


def test_a_regions_profile_is_its_end_mark_minus_its_start_and_holds_only_the_region(grower, tmp_path):
    count, profile = _region(grower, 20_000, tmp_path / "small")
    assert profile is not None and profile.total == count  # to the instruction
    functions = dict(profile.functions)
    assert functions[WORK] > 0.9 * count  # the region is the loop
    assert "helper(long)" not in functions  # ran before the start mark only
    more_count, more = _region(grower, 40_000, tmp_path / "large")
    assert more is not None and more_count > count * 1.5
    (first, *_) = grew(profile, more)
    assert first["name"] == WORK and first["short"] == "ns::Grower<…>::work(…)"
    assert first["change"] == dict(more.functions)[WORK] - functions[WORK]
    assert 80 < first["change_pct"] < 120 and first["share_pct"] > 90  # twice the loop, most of the change
    assert COUNTERS["valgrind"].region_profile(tmp_path / "small", {"count": 5}) is None  # no marks: no profile
    assert COUNTERS["perf"].region_profile(tmp_path / "small", {"count": 5}) is None  # perf counts no functions


def test_a_profile_keeps_its_top_functions_and_says_how_much_a_left_out_one_ran_at_most():
    counts = {f"f{i}": 1000 - i for i in range(300)}
    kept = top(counts, keep=200)
    assert len(kept.functions) == 200 and kept.seen == 300 and kept.total == sum(counts.values())
    assert kept.functions[0] == ("f0", 1000) and kept.floor == 801
    assert Profile.from_dict(json.loads(json.dumps(kept.to_dict()))) == kept
    assert top({"a": 5}).floor == 0  # all kept: a function not listed did not run
    assert subtract({"a": 10, "b": 3, "c": 7}, {"a": 4, "b": 3}) == {"a": 6, "c": 7}
    assert profiles.add([{"a": 1}, {"a": 2, "b": 1}]) == {"a": 3, "b": 1}
    assert top({"x\0y": 1}).functions[0][0] == "x\ufffdy"  # storable on PostgreSQL
    with pytest.raises(profiles.ProfileError, match="lacks or mistypes"):
        Profile.from_dict({"total": 1})
    # per call: a worker's timed calls are counted together
    assert Profile(100, (("a", 60),), 1, 0).per(10) == Profile(10, (("a", 6),), 1, 0)


def test_the_diff_ranks_growth_and_bounds_what_a_side_did_not_keep():
    control = Profile(1000, (("a", 500), ("b", 300), ("c", 100)), 10, 50)
    treatment = Profile(1400, (("a", 520), ("b", 600), ("d", 200)), 10, 0)
    rows = grew(control, treatment)
    assert [r["name"] for r in rows] == ["b", "d", "a"]  # c shrank (not kept: at most 0), left out
    b, d, _ = rows
    assert b["change"] == 300 and b["change_pct"] == pytest.approx(100.0) and b["share_pct"] == pytest.approx(75.0)
    # d was not among the control's kept functions: it ran at most 50 there, so it grew by at least 150
    assert d["control"] is None and d["change"] == 150 and d["at_least"] and not d["new"]
    assert grew(Profile(10, (), 0, 0), Profile(20, (("n", 20),), 1, 0))[0]["new"]
    stripped = Profile(100, (("???", 90), ("f", 10)), 2, 0), Profile(200, (("???", 180), ("f", 20)), 2, 0)
    assert [r["name"] for r in grew(*stripped)] == ["f"]  # code without a symbol is no function
    assert profiles.unnamed(*stripped) == {"control": 90, "treatment": 180, "change": 90, "share_pct": 90.0}
    assert profiles.unnamed(control, treatment) is None


def test_long_cpp_names_are_shortened_for_tables_and_kept_whole():
    name = ("void tvm::runtime::TypedPackedFunc<tvm::RelaxExpr (tvm::RelaxExpr)>::AssignTypedLambda<F>(F, "
            "std::string)::{lambda(tvm::runtime::TVMArgs const&, tvm::runtime::TVMRetValue*)#1}::operator()"
            "(tvm::runtime::TVMArgs const&, tvm::runtime::TVMRetValue*) const")
    assert short_name(name) == ("tvm::runtime::TypedPackedFunc<…>::AssignTypedLambda<…>(…)::{lambda(…)#1}"
                                "::operator()(…)")
    assert short_name("tvm::tir::StmtMutator::VisitStmt_(tvm::tir::ForNode const*)") == \
        "tvm::tir::StmtMutator::VisitStmt_(…)"
    assert short_name("operator new(unsigned long)") == "operator new(…)"
    assert short_name("???") == "??? (no symbol)"
    assert short_name("(anonymous namespace)::Pass::Run(int)") == "(anonymous namespace)::Pass::Run(…)"
    assert short_name("tvm::runtime::ObjectPtr<tvm::Object>::operator->() const") == \
        "tvm::runtime::ObjectPtr<…>::operator->()"
    long = "tvm::" + "x" * 300 + "::f()"
    assert len(short_name(long)) == profiles.SHORT and short_name(long).endswith("::f()")


def _details(rows=None, reason=None):
    profile = {"reason": reason} if reason else {
        "process": "median count of each side", "control": {"total": 100}, "treatment": {"total": 300},
        "grew": rows}
    return {"source": "valgrind", "profile": profile}


ROW = {"name": "tvm::Foo<int>::bar(x|y)", "short": "tvm::Foo<…>::bar(…) <script>|`", "control": 10, "treatment": 210,
       "change": 200, "change_pct": 2000.0, "share_pct": 100.0, "new": False, "at_least": False}


def test_each_kind_of_regression_is_explained_by_what_was_measured_for_it():
    compile_counted = {"compile_instructions": _details([ROW]), "instructions": _details([]),
                       "ops": [{"name": "fused_dense", "features": "dense 1x8 float32", "control_us": 10.0,
                                "treatment_us": 15.0, "change_pct": 50.0, "share_pct": 100.0}]}
    on_counts = explain("compile-time", "instructions", compile_counted)
    assert on_counts["what"] == "functions" and on_counts["rows"] == [ROW] and on_counts["region"] == "compile"
    assert on_counts["totals"] == {"control": 100, "treatment": 300} and not on_counts["note"]
    on_wall = explain("compile-time", "time", compile_counted)  # counted beside wall time: shown, and said
    assert on_wall["rows"] == [ROW] and "wall time" in on_wall["note"]
    none = explain("compile-time", "time", {"compile_ms": {}})
    assert none["what"] is None and "no profile is available" in none["reason"]
    assert explain("runtime", "instructions", compile_counted)["reason"] == "no function ran more instructions"
    ops = explain("runtime", "time", compile_counted)
    assert ops["what"] == "operators" and ops["rows"][0]["features"] == "dense 1x8 float32"
    assert explain("runtime", "time", {})["what"] is None  # a command workload: no operators
    perf = explain("runtime", "instructions", {"instructions": _details(reason="perf counts instructions, not ...")})
    assert perf["what"] is None and "perf" in perf["reason"]
    assert "counted before profiles" in explain("runtime", "instructions", {"instructions": {"source": "valgrind"}})["reason"]
    assert explain("correctness", "time", compile_counted)["what"] is None


def test_comments_and_alerts_show_the_top_five_safely():
    explained = explain("compile-time", "instructions", {"compile_instructions": _details([ROW] * 7)})
    text = text_lines(explained)
    assert text[0].startswith("functions that grew most (compile instructions, valgrind)")
    assert len(text) == 6 and "10 -> 210 (+200, +2000.0%)" in text[1]
    markdown = markdown_lines(explained, _cell)
    rows = [line for line in markdown if line.startswith("| `")]
    assert len(rows) == 5  # the top five under the table
    assert "\\|" in rows[0] and "`" not in rows[0][3:rows[0].index(" |", 3) - 1]  # no cell or code span broken
    assert markdown_lines(explain("compile-time", "time", {}), _cell)[0].startswith("No profile: judged on")
    stripped = _details([ROW])
    stripped["profile"]["no_symbol"] = {"control": 50, "treatment": 250, "change": 200, "share_pct": 50.0}
    explained = explain("runtime", "instructions", {"instructions": stripped})
    assert text_lines(explained)[-1] == "  code without a symbol (a stripped library's own functions): +200, 50% of the change"
    assert markdown_lines(explained, _cell)[-1].startswith("Code without a symbol")


def check_a_real_tvm_compile_regressions_profile(capsys, tmp_path, sqlite_url, payload: dict) -> None:
    """Of a compare of one TVM release on both sides whose treatment's script makes a module with
    three more functions to compile (tests/test_instructions.py runs it, once for both files'
    checks): the counted compile regions' profiles (each side's median process) name the TVM
    functions whose instructions grew, demangled, and the API, the regression page and the alert
    say so from what the run stored."""
    import requests
    from sqlalchemy.orm import Session

    from conftest import live_server
    from abwatch.service.notify import alerts
    from abwatch.service.store.db import make_engine
    from abwatch.service.store.models import Regression

    result = payload["results"][0]
    compiled = result["compile_instructions"]
    assert compiled["verdict"] == "regression", compiled
    profile = compiled["profile"]
    assert profile["process"] == "median count of each side"
    for side in ("control", "treatment"):
        kept = profile[side]
        assert len(kept["functions"]) <= profiles.TOP and kept["seen"] > len(kept["functions"])  # bounded
        # the region's profile is the region's count: the median process's, to the instruction
        assert kept["total"] == sorted(compiled[f"{side}_counts"])[(len(compiled[f"{side}_counts"]) - 1) // 2]
    with capsys.disabled():  # what the diff says, for the record
        print("\nregion totals", profile["control"]["total"], profile["treatment"]["total"],
              "functions seen", profile["control"]["seen"], profile["treatment"]["seen"])
        for row in profile["grew"]:
            print(f"  +{row['change']:,} ({row['change_pct']}%) {row['short']}  [{row['name'][:200]}]")
    tvm_names = [row["name"] for row in profile["grew"] if "tvm::" in row["name"]]
    assert tvm_names, [row["name"] for row in profile["grew"]]  # TVM's own C++ functions grew
    assert "???" not in [row["name"] for row in profile["grew"]]  # code without a symbol: apart
    assert profile["no_symbol"]["change"] > 0  # most of a release wheel's libtvm.so has no symbol
    assert not [row for row in profile["grew"] if row["name"].startswith("_Z")]  # demangled
    assert all(row["change"] > 0 for row in profile["grew"])
    # the timed runs were counted too, with their own profile (per call)
    assert "grew" in result["instructions"]["profile"] or "reason" in result["instructions"]["profile"]

    (regression,) = [r for r in json.loads(_main_out(capsys, "regressions", "--json", "--db", sqlite_url))
                     if r["kind"] == "compile-time"]
    with live_server(sqlite_url, tmp_path / "serve") as base:
        api = requests.get(f"{base}/api/regressions/{regression['id']}", timeout=30).json()
        page = requests.get(f"{base}/regressions/{regression['id']}", timeout=30).text
    explained = api["explanation"]
    assert explained["what"] == "functions" and explained["region"] == "compile"
    assert regression["explanation"] == explained  # `regressions --json` shows the same
    assert [row["name"] for row in explained["rows"]] == [row["name"] for row in profile["grew"]]  # as stored
    section = page[page.index("What explains it"):page.index("</table>", page.index("What explains it"))]
    first_tvm = next(row for row in explained["rows"] if "tvm::" in row["name"])
    shown = first_tvm["short"].replace("<", "&lt;").replace(">", "&gt;")  # escaped on the page
    assert shown in section, section[:2000]
    engine = make_engine(sqlite_url)
    with Session(engine) as session:
        text = alerts.payload(session.get(Regression, regression["id"]), "regress")["text"]
    engine.dispose()
    assert "functions that grew most (compile instructions, valgrind)" in text
    assert all(row["short"] in text for row in explained["rows"][:5])  # the top five
    assert "code without a symbol" in text and "Code without a symbol" in page


def _main_out(capsys, *argv) -> str:
    from abwatch.service.cli.main import main

    main([str(a) for a in argv])
    return capsys.readouterr().out
