"""The dashboard in a real headless Chromium (Debian's chromium + chromedriver, via selenium),
served by a real `abwatch serve` process on a database filled by real `abwatch compare` runs.
Every page is checked for its content and rendered charts, and screenshotted."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import requests
from selenium import webdriver
from selenium.common.exceptions import NoSuchElementException, StaleElementReferenceException
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.action_chains import ActionChains
from selenium.webdriver.common.by import By
from selenium.webdriver.support import expected_conditions as EC
from selenium.webdriver.support.ui import Select, WebDriverWait


pytestmark = pytest.mark.slow  # real builds, runs, processes or servers

@pytest.fixture(scope="module")
def browser():
    """Headless Chromium driven through the system chromedriver."""
    chromium, driver = shutil.which("chromium"), shutil.which("chromedriver")
    assert chromium and driver, "install Debian's chromium and chromium-driver (.ci/run does)"
    options = webdriver.ChromeOptions()
    options.binary_location = chromium
    for flag in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--window-size=1400,1000"):
        options.add_argument(flag)
    browser = webdriver.Chrome(service=Service(driver), options=options)
    browser.set_page_load_timeout(60)
    yield browser
    browser.quit()


def open_page(browser, url: str, shots: Path, name: str, charts: int = 0):
    """Load ``url``, wait for ``charts`` plotly charts to draw, check nothing failed, screenshot."""
    browser.get(url)
    wait = WebDriverWait(browser, 30)
    if charts:
        wait.until(lambda b: len(b.find_elements(By.CSS_SELECTOR, ".js-plotly-plot .main-svg")) >= charts)
    # script errors fail the page; a refused fetch (a 401 the test provoked, a 404 page) is not one
    errors = [e for e in browser.get_log("browser")
              if e["level"] == "SEVERE" and "Failed to load resource" not in e["message"]]
    assert errors == [], errors
    shots.mkdir(parents=True, exist_ok=True)
    assert browser.save_screenshot(str(shots / f"{name}.png"))
    return wait


def assets_are_local(browser, base: str) -> None:
    """Every script and stylesheet the page loaded came from the app itself."""
    urls = browser.execute_script(
        "return [...document.scripts].map(s => s.src).filter(Boolean)"
        ".concat([...document.querySelectorAll('link[rel=stylesheet]')].map(l => l.href))")
    assert urls and all(u.startswith(base + "/static/") for u in urls), urls


def test_overview(browser, filled_server, tmp_path):
    base, runs, _ = filled_server
    open_page(browser, base + "/", tmp_path, "overview")
    assets_are_local(browser, base)
    assert "No branch is watched" in browser.find_element(By.ID, "watched").text  # compares only
    compared = browser.find_element(By.ID, "compared").text
    assert f"run {runs['faster']}" in compared and "Do 20% less work" in compared
    open_regs = browser.find_element(By.ID, "open-regressions").text
    assert "Open regressions (1)" in open_regs and "lcg-loop" in open_regs and "regress" in open_regs
    assert "improvement" in browser.find_element(By.ID, "latest").text
    rows = browser.find_elements(By.CSS_SELECTOR, "#runs table tr")
    assert len(rows) == 1 + len(runs)


def test_workload_trend_marks_regressions_and_clicks_through_to_the_run(browser, filled_server, tmp_path):
    base, runs, _ = filled_server
    open_page(browser, base + "/workloads/lcg-loop", tmp_path, "trend", charts=1)
    chart = browser.find_element(By.CSS_SELECTOR, ".trend-chart")
    traces = browser.execute_script("return arguments[0].data.map(t => [t.name, t.y.length])", chart)
    assert traces == [["ms (fastest per process)", 4], ["regression", 1]]
    # axis titles drawn (with units), and a y range that shows a change at its size
    assert "commit" in chart.find_element(By.CSS_SELECTOR, ".g-xtitle").text
    assert "ms" in chart.find_element(By.CSS_SELECTOR, ".g-ytitle").text
    y, low, high = browser.execute_script(
        "const c = arguments[0]; return [c.data[0].y, ...c._fullLayout.yaxis.range]", chart)
    median = sorted(y)[len(y) // 2]
    assert low <= min(min(y), median * 0.95) and high >= max(max(y), median * 1.05)
    assert len(chart.find_elements(By.CSS_SELECTOR, "g.scatterlayer path.point")) == 5
    # clicking the regression marker (a real mouse click at its place) opens the run that found it
    marker = chart.find_elements(By.CSS_SELECTOR, "g.scatterlayer g.trace")[1].find_element(By.CSS_SELECTOR, "path.point")
    ActionChains(browser).move_to_element(marker).pause(0.5).click().perform()
    WebDriverWait(browser, 20).until(EC.url_contains("/runs/"), message=browser.current_url)
    assert browser.current_url.endswith(f"/runs/{runs['regression']}")


def test_run_page(browser, filled_server, tmp_path):
    base, runs, _ = filled_server
    open_page(browser, f"{base}/runs/{runs['regression']}", tmp_path, "run", charts=1)
    verdicts = browser.find_element(By.ID, "verdicts").text
    assert "regression" in verdicts and "lcg-loop" in verdicts and "[+" in verdicts
    chart = browser.find_element(By.CSS_SELECTOR, ".process-chart")
    names = browser.execute_script("return arguments[0].data.map(t => t.name)", chart)
    assert names == ["control", "treatment"]
    assert "process" in chart.find_element(By.CSS_SELECTOR, ".g-xtitle").text
    assert "ms" in chart.find_element(By.CSS_SELECTOR, ".g-ytitle").text
    points = chart.find_elements(By.CSS_SELECTOR, "g.scatterlayer path.point")
    report = requests.get(f"{base}/api/runs/{runs['regression']}", timeout=10).json()
    medians = report["process_medians_ms"]["lcg-loop"]
    assert len(points) == len(medians["control"]) + len(medians["treatment"])
    builds = browser.find_element(By.ID, "builds").text
    assert "noop" in builds and ("reused" in builds or "built for this run" in builds)
    assert "True" not in builds and "False" not in builds  # words, not Python's booleans
    # each build's status opens its page (the command builder has no compiler cache to count)
    browser.find_element(By.ID, "builds").find_elements(By.LINK_TEXT, "success")[0].click()
    WebDriverWait(browser, 20).until(EC.url_contains("/builds/"), message=browser.current_url)
    assert browser.current_url.endswith(f"/builds/{report['builds'][0]['build_id']}")
    assert "does not compile through ccache" in browser.find_element(By.ID, "compiler-cache").text
    assert "Reword the README only" in browser.find_element(By.ID, "build").text  # the noop commit


def test_regression_page_and_triage_from_the_browser(browser, filled_server, tmp_path):
    base, runs, token = filled_server
    (regression,) = requests.get(base + "/api/regressions", timeout=10).json()
    open_page(browser, f"{base}/regressions/{regression['id']}", tmp_path, "regression", charts=1)
    assert [r.text.split()[2] for r in browser.find_elements(By.CSS_SELECTOR, "#events tr")[1:]] == [
        "benchmark", "verify", "regress"]
    assert "Do 20% more work" in browser.find_element(By.ID, "range").text
    assert "not bisected" in browser.find_element(By.ID, "culprit").text
    assert browser.find_element(By.ID, "bisection").text
    form = browser.find_element(By.ID, "triage-form")
    Select(form.find_element(By.NAME, "as")).select_by_visible_text("acknowledged")
    form.find_element(By.NAME, "who").send_keys("ana")
    form.find_element(By.NAME, "note").send_keys("looking into the loop")
    form.find_element(By.NAME, "token").send_keys("wrong")
    form.find_element(By.CSS_SELECTOR, "button").click()
    WebDriverWait(browser, 20).until(lambda b: "refused" in b.find_element(By.ID, "triage-status").text)
    assert requests.get(f"{base}/api/regressions/{regression['id']}", timeout=10).json()["triage_events"] == []
    form.find_element(By.NAME, "token").clear()
    form.find_element(By.NAME, "token").send_keys(token)
    form.find_element(By.CSS_SELECTOR, "button").click()
    # the page reloads after a successful triage: an element found just before the reload goes
    # stale, so the wait looks again instead of failing
    WebDriverWait(browser, 20, ignored_exceptions=[StaleElementReferenceException, NoSuchElementException]).until(
        lambda b: "looking into the loop" in b.find_element(By.ID, "triage").text)
    open_page(browser, f"{base}/regressions/{regression['id']}", tmp_path, "regression-triaged", charts=1)
    detail = requests.get(f"{base}/api/regressions/{regression['id']}", timeout=10).json()
    assert detail["triage"] == "acknowledged"
    assert [(t["status"], t["who"]) for t in detail["triage_events"]] == [("acknowledged", "ana")]


def test_missing_pages_say_so(browser, filled_server, tmp_path):
    base, _, _ = filled_server
    open_page(browser, base + "/runs/999999", tmp_path, "missing")
    assert "run 999999 does not exist" in browser.find_element(By.TAG_NAME, "main").text


def test_a_bisected_culprit_reads_the_same_in_the_cli_the_api_and_the_page(browser, tmp_path, fresh_pg_url, capsys):
    """One serializer: after a nightly watch bisects a range of several commits, ``abwatch
    regressions --json``, ``GET /api/regressions/{id}`` and the regression page name the same
    culprit and the same steps, each step with the run that decided it."""
    import json

    from abwatch.service.cli.demo import make_demo_repo
    from abwatch.service.cli.main import main
    from tests.conftest import live_server
    from tests.test_watch import shas, step, write_watch_config

    repo = tmp_path / "repo"
    make_demo_repo(repo, (step("base", "Baseline"),))
    config = write_watch_config(tmp_path, repo, 'schedule = "0 2 * * *"', threshold_pct=5.0)
    assert main(["watch", "--config", config, "--once", "--db", fresh_pg_url]) == 0
    make_demo_repo(repo, (step("n1", "README", note="n1"), step("slow", "Do 25% more work", 1.25),
                          step("n2", "README", 1.25, note="n2"), step("n3", "README", 1.25, note="n3")))
    assert main(["watch", "--config", config, "--once", "--db", fresh_pg_url]) == 1
    tags = shas(repo)
    capsys.readouterr()
    assert main(["regressions", "--json", "--db", fresh_pg_url]) == 0
    (cli,) = json.loads(capsys.readouterr().out)
    assert cli["culprit"]["sha"] == tags["slow"] and len(cli["bisection"]) >= 2
    assert all(s["run_id"] and s["side"] in ("good", "bad") for s in cli["bisection"])
    with live_server(fresh_pg_url, tmp_path / "server") as base:
        api = requests.get(f"{base}/api/regressions/{cli['id']}", timeout=10).json()
        assert api["culprit"] == cli["culprit"] and api["bisection"] == cli["bisection"]
        assert api["range"] == cli["range"] and api["kind"] == cli["kind"] == "runtime"
        open_page(browser, f"{base}/regressions/{cli['id']}", tmp_path, "regression-bisected", charts=1)
        assert tags["slow"][:12] in browser.find_element(By.ID, "culprit").text
        assert "named by bisection" in browser.find_element(By.ID, "culprit").text
        rows = browser.find_elements(By.CSS_SELECTOR, "#bisection tr")[1:]
        assert [r.text.split()[1] for r in rows] == [s["sha"][:12] for s in cli["bisection"]]
        assert [r.text.split()[-1] for r in rows] == [str(s["run_id"]) for s in cli["bisection"]]
