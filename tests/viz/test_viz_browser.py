"""The pages in a real browser: headless Chromium opens each, steps through it, and the counters it shows
must equal the tracer's and the closed forms; any JavaScript error fails the test."""
import os
import shutil

import pytest

from flashtile.trace import trace
from flashtile.viz import playground, render

CHROMIUM, CHROMEDRIVER = shutil.which("chromium"), shutil.which("chromedriver")
if os.environ.get("FLASHTILE_REQUIRE_BROWSER") == "1" and not (CHROMIUM and CHROMEDRIVER):
    raise RuntimeError("FLASHTILE_REQUIRE_BROWSER=1 but chromium / chromedriver are not installed")
pytestmark = pytest.mark.skipif(not (CHROMIUM and CHROMEDRIVER),
                                reason="needs Debian's chromium and chromium-driver (.ci/run installs them)")


@pytest.fixture(scope="module")
def browser():
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service
    options = webdriver.ChromeOptions()
    for flag in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync",
                 "--window-size=1400,1000"):
        options.add_argument(flag)
    options.binary_location = CHROMIUM
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver = webdriver.Chrome(service=Service(CHROMEDRIVER), options=options)
    yield driver
    driver.quit()


def open_page(browser, tmp_path, html, name):
    path = tmp_path / f"{name}.html"
    path.write_text(html)
    browser.get(path.as_uri())
    return browser


def scrub_to(browser, steps):
    """Moves the page's scrubber to ``steps`` steps applied (a number, or "s.max" for all) as a learner's drag does."""
    browser.execute_script(f"const s = document.getElementById('scrub'); s.value = {steps};"
                           "s.dispatchEvent(new Event('input'));")


def assert_no_js_errors(browser):
    from selenium.webdriver.common.by import By
    assert browser.find_element(By.ID, "errors").text == ""
    severe = [e for e in browser.get_log("browser") if e["level"] == "SEVERE"]
    assert not severe, severe


def shown_counters(browser, tensors):
    from selenium.webdriver.common.by import By
    read = {t: int(browser.find_element(By.ID, f"counter-{t}-read").text) for t in tensors}
    written = {t: int(browser.find_element(By.ID, f"counter-{t}-written").text) for t in tensors}
    return read, written


@pytest.mark.parametrize("algo, causal", [("naive", False), ("softmax", True), ("fa1", False), ("fa1", True),
                                          ("fa2", False), ("fa2", True), ("fa2_bwd", False), ("fa2_bwd", True),
                                          ("decode", False)])
def test_page_steps_and_counts(browser, tmp_path, algo, causal):
    from selenium.webdriver.common.by import By
    t = trace(algo, seqlen=8, head_dim=4, block_m=2, block_n=2, causal=causal)
    open_page(browser, tmp_path, render(t), algo)
    assert_no_js_errors(browser)
    tensors = list(t.shapes)
    # step by step through the first steps: the page's counters follow the trace's prefix sums
    for n in range(1, 13):
        browser.find_element(By.ID, "next").click()
        read, written = shown_counters(browser, tensors)
        for name in tensors:
            assert read[name] == sum(s.bytes for s in t.steps[:n] if s.kind == "load" and s.tensor == name)
            assert written[name] == sum(s.bytes for s in t.steps[:n] if s.kind == "store" and s.tensor == name)
        assert browser.find_element(By.ID, "position").text == f"{n} / {len(t.steps)}"
        current_line = browser.find_element(By.CSS_SELECTOR, "#code .current").get_attribute("id")
        assert current_line == f"code-line-{t.steps[n - 1].line}"
    # scrub to the end: the totals equal the tracer's
    scrub_to(browser, "s.max")
    read, written = shown_counters(browser, tensors)
    assert {n: {"read": read[n], "written": written[n]} for n in tensors} == {
        n: t.counters().get(n, {"read": 0, "written": 0}) for n in tensors}
    skips = [i for i, s in enumerate(t.steps) if s.kind == "skip"]
    assert bool(skips) == (causal and algo in ("fa1", "fa2", "fa2_bwd"))
    assert browser.find_element(By.ID, "work").is_displayed() == (algo in ("fa1", "fa2", "fa2_bwd"))
    if skips:  # at a skip step the score tiles show that pair's work as skipped, and no HBM tile is hatched
        scrub_to(browser, skips[0] + 1)
        step = t.steps[skips[0]]
        cell = browser.find_element(By.ID, f"work-{step.pair[0]}-{step.pair[1]}")
        assert "skip" in cell.get_attribute("class")
        assert not browser.find_elements(By.CSS_SELECTOR, "#hbm-tensors .tile.skip")
        done = [s.pair for s in t.steps[:skips[0]] if s.kind == "compute" and s.pair]
        assert all("touched" in browser.find_element(By.ID, f"work-{i}-{j}").get_attribute("class")
                   for i, j in done[:-1])
    assert_no_js_errors(browser)


def test_closed_form_counts_on_the_page(browser, tmp_path):
    """FlashAttention-1 re-reads Q once per K/V tile; FlashAttention-2 reads it once — as the pages say."""
    n, d, block, item = 8, 4, 2, 2
    for algo, q_reads, o_writes in (("fa1", n // block, n // block), ("fa2", 1, 1)):
        t = trace(algo, n, d, block, block)
        open_page(browser, tmp_path, render(t), algo)
        scrub_to(browser, "s.max")
        read, written = shown_counters(browser, ["Q", "O", "K"])
        assert read["Q"] == q_reads * n * d * item and written["O"] == o_writes * n * d * item
        assert read["K"] == (n * d * item if algo == "fa1" else (n // block) * n * d * item)


def test_play_and_pause(browser, tmp_path):
    import time

    from selenium.webdriver.common.by import By
    open_page(browser, tmp_path, render(trace("fa2")), "fa2-play")
    browser.find_element(By.ID, "play").click()
    time.sleep(1.0)
    browser.find_element(By.ID, "pause").click()
    position = browser.find_element(By.ID, "position").text
    assert not position.startswith("0 /")
    time.sleep(0.6)
    assert browser.find_element(By.ID, "position").text == position
    assert_no_js_errors(browser)


def test_playground(browser, tmp_path):
    from selenium.webdriver.common.by import By
    open_page(browser, tmp_path, playground(), "playground")
    browser.find_element(By.ID, "S-3-1").click()
    assert "P[3][1]" in browser.find_element(By.ID, "explain").text
    assert "picked" in browser.find_element(By.ID, "P-3-1").get_attribute("class")
    assert "hl" in browser.find_element(By.ID, "O-3-0").get_attribute("class")
    assert browser.find_element(By.ID, "P-0-5").text != "0.00"
    browser.find_element(By.ID, "causal").click()
    assert browser.find_element(By.ID, "S-0-5").text == "−∞"
    assert browser.find_element(By.ID, "P-0-5").text == "0.00"
    rows = browser.execute_script("return window.PLAYGROUND.P.map(r => r.reduce((a, b) => a + b, 0));")
    assert all(abs(r - 1) < 1e-9 for r in rows)
    future = browser.execute_script("return window.PLAYGROUND.P.flatMap((r, i) => r.filter((_, j) => j > i));")
    assert all(p == 0 for p in future)
    browser.find_element(By.ID, "S-0-5").click()
    assert "in the future" in browser.find_element(By.ID, "explain").text
    assert_no_js_errors(browser)


def test_playground_shows_what_a_score_uses_and_takes_edits(browser, tmp_path):
    """A clicked score lights the K and V rows it uses; every matrix shows its row and column indices; an edited
    value of Q changes S, P and O as the formulas say; new draws keep every row of P a distribution."""
    from selenium.webdriver.common.by import By
    open_page(browser, tmp_path, playground(), "playground-edit")
    browser.find_element(By.ID, "S-3-1").click()
    for name in ("K", "V"):
        assert all("hl" in browser.find_element(By.ID, f"{name}-1-{c}").get_attribute("class") for c in range(4))
        assert "hl" not in (browser.find_element(By.ID, f"{name}-2-0").get_attribute("class") or "")
    indices = [e.text for e in browser.find_elements(By.CSS_SELECTOR, "#S th.index")]
    assert indices == [str(j) for j in range(6)] * 2
    for c in range(4):  # query 2 becomes the zero vector: its scores are all 0, its weights uniform
        field = browser.find_element(By.ID, f"Q-in-2-{c}")
        browser.execute_script("arguments[0].value = '0'; arguments[0].dispatchEvent(new Event('change'))", field)
    p_row = browser.execute_script("return window.PLAYGROUND.P[2];")
    assert all(abs(p - 1 / 6) < 1e-12 for p in p_row)
    o_row = browser.execute_script("return window.PLAYGROUND.O[2];")
    v_mean = browser.execute_script("return [0, 1, 2, 3].map(c => DATA.V.reduce((a, r) => a + r[c], 0) / 6);")
    assert all(abs(o - m) < 1e-9 for o, m in zip(o_row, v_mean))
    before = browser.execute_script("return DATA.K.map(r => r.slice());")
    browser.find_element(By.ID, "reseed").click()
    assert browser.execute_script("return DATA.K;") != before
    rows = browser.execute_script("return window.PLAYGROUND.P.map(r => r.reduce((a, b) => a + b, 0));")
    assert all(abs(r - 1) < 1e-9 for r in rows)
    assert_no_js_errors(browser)


def test_page_explains_itself_and_takes_keys(browser, tmp_path):
    """The title names the algorithm and its parameters, an intro says what to watch, a legend names every tile
    state, the counters say their unit; space plays and pauses, the arrows step, Home resets; the speed control
    is there; a tile written back leaves the SRAM box after its own step."""
    import time

    from selenium.webdriver.common.by import By
    from selenium.webdriver.common.keys import Keys
    t = trace("fa2_bwd", seqlen=8, head_dim=4, block_m=2, block_n=2, causal=True)
    open_page(browser, tmp_path, render(t), "explained")
    title = browser.find_element(By.ID, "title").text
    assert "FlashAttention-2 backward" in title and "N=8, D=4, tiles 2×2, causal" in title
    assert "dQ" in browser.find_element(By.ID, "intro").text
    legend = browser.find_element(By.ID, "legend")
    assert len(legend.find_elements(By.CSS_SELECTOR, ".tile")) == 5 and "skipped" in legend.text
    body = browser.find_element(By.TAG_NAME, "body")
    body.send_keys(Keys.ARROW_RIGHT)  # stepping repaints the HBM tiles, never the legend's swatches
    swatches = [e.get_attribute("class") for e in legend.find_elements(By.CSS_SELECTOR, ".tile")]
    assert swatches == ["tile load", "tile store", "tile touched", "tile", "tile skip"]
    body.send_keys(Keys.HOME)
    assert "2 bytes per element" in browser.find_element(By.ID, "units").text
    assert len(browser.find_elements(By.CSS_SELECTOR, "#speed option")) == 5
    position = lambda: browser.find_element(By.ID, "position").text.split(" /")[0]  # noqa: E731
    body.send_keys(Keys.ARROW_RIGHT, Keys.ARROW_RIGHT, Keys.ARROW_RIGHT)
    assert position() == "3"  # load O, load dO, store D of tile 0
    chips = browser.find_element(By.ID, "sram-tiles").text
    assert "D[0,0] → HBM" in chips and "O[0,0]" in chips
    body.send_keys(Keys.ARROW_RIGHT)
    assert "D[0,0]" not in browser.find_element(By.ID, "sram-tiles").text  # written back: no longer on chip
    body.send_keys(Keys.ARROW_LEFT)
    assert position() == "3"
    body.send_keys(Keys.HOME)
    assert position() == "0"
    body.send_keys(" ")
    time.sleep(1.0)
    body.send_keys(" ")
    played = int(position())
    time.sleep(0.6)
    assert played > 0 and int(position()) == played  # paused
    assert_no_js_errors(browser)


@pytest.mark.parametrize("algo", ["fa2", "decode"])
def test_sram_holds_only_the_current_programs_tiles(browser, tmp_path, algo):
    """SRAM shows the tiles the current program (FA2: a Q tile's; decode: a split's) loaded, named in its heading:
    at the first step of the second program, nothing of the first one is left."""
    from selenium.webdriver.common.by import By
    t = trace(algo, seqlen=8, head_dim=4, block_m=2, block_n=2)
    second = next(i for i, s in enumerate(t.steps) if s.program != t.steps[0].program)
    open_page(browser, tmp_path, render(t), f"sram-{algo}")
    scrub_to(browser, second)
    before = browser.find_element(By.ID, "sram-tiles").text
    assert "K[" in before and t.steps[0].program.lower() in browser.find_element(By.ID, "program").text.lower()
    scrub_to(browser, second + 1)
    chips = browser.find_element(By.ID, "sram-tiles").text.split()
    step = t.steps[second]
    assert chips == [f"{step.tensor}[{step.tile[0]},{step.tile[1]}]"]
    assert step.program.lower() in browser.find_element(By.ID, "program").text.lower()
    assert_no_js_errors(browser)


def test_pipeline_page_shows_the_numbers_of_its_trace(browser, tmp_path):
    """The recorded-pipeline page (flashtile/viz/pipeline.py) on a made-up trace of two programs: a lane per
    warp role, a bar per recorded phase, a legend of the phases shown, and for each program the numbers that
    pipeline.summary reads off the same trace."""
    from pipeline_traces import META, program, proton_trace
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import Select

    from flashtile.viz import pipeline
    recorded = pipeline.from_proton(proton_trace({0: program(0), 1: program(0, stretch=2)}), META)
    open_page(browser, tmp_path, pipeline.render(recorded), "pipeline")
    assert_no_js_errors(browser)
    assert "N=4096, D=128" in browser.find_element(By.ID, "title").text
    assert "loader" in browser.find_element(By.ID, "intro").text
    legend = browser.find_element(By.ID, "legend").text
    assert all(name in legend for name in ("wait stage free", "load K", "issue MMA", "softmax", "epilogue"))
    formats = dict(span_us="{:.2f}", tensor_busy="{:.3f}", kv_waits="{}", kv_wait_ns="{:.1f}",
                   kv_wait_share="{:.3f}", softmax_share="{:.3f}", turn_wait_share="{:.3f}", stage_wait_ns="{:.1f}")
    Select(browser.find_element(By.ID, "zoom")).select_by_value("1")
    for index, numbers in enumerate(pipeline.summary(recorded)["programs"]):
        Select(browser.find_element(By.ID, "program")).select_by_index(index)
        shown = {key: browser.find_element(By.ID, f"number-{key}").text for key in formats}
        assert shown == {key: fmt.format(numbers[key]) for key, fmt in formats.items()}
        bars = browser.find_elements(By.CSS_SELECTOR, "#timeline rect.bar")
        assert len(bars) == sum(len(lane["events"]) for lane in recorded["programs"][index]["lanes"])
        verdict = browser.find_element(By.ID, "verdict").text  # the numbers in words, over the picture
        assert f"{100 * numbers['tensor_busy']:.1f}%" in verdict and f"{numbers['kv_wait_ns']:.1f} ns" in verdict
        assert f"{numbers['stage_wait_ns']:.1f} ns" in verdict and "loads run ahead" in verdict
    assert browser.find_element(By.ID, "number-span_us").text == "0.28"  # the second program, twice as slow
    recorded = browser.find_element(By.ID, "meta").text  # what the records cost the launch
    assert "longest recorded program ran 0.3 µs" in recorded and "takes 3.5 µs" in recorded  # 280 cycles at 1 GHz
    assert_no_js_errors(browser)


def test_pipeline_page_of_the_shipped_trace(browser, tmp_path):
    """The page of the trace that ships (recorded on an H200) shows, for each program, the numbers pipeline.summary
    reads off the file, and a bar per recorded phase."""
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import Select

    from flashtile.viz import pipeline
    shipped = pipeline.load()
    open_page(browser, tmp_path, pipeline.render(shipped), "pipeline")
    Select(browser.find_element(By.ID, "zoom")).select_by_value("1")
    for index, numbers in enumerate(pipeline.summary(shipped)["programs"]):
        Select(browser.find_element(By.ID, "program")).select_by_index(index)
        assert browser.find_element(By.ID, "number-tensor_busy").text == f"{numbers['tensor_busy']:.3f}"
        assert browser.find_element(By.ID, "number-kv_wait_ns").text == f"{numbers['kv_wait_ns']:.1f}"
        bars = browser.find_elements(By.CSS_SELECTOR, "#timeline rect.bar")
        assert len(bars) == sum(len(lane["events"]) for lane in shipped["programs"][index]["lanes"])
    longest = max(p["span_us"] for p in pipeline.summary(shipped)["programs"])  # what the records cost, in words
    meta = browser.find_element(By.ID, "meta").text
    assert f"The longest recorded program ran {longest:.1f} µs" in meta
    assert f"the whole launch takes {shipped['meta']['unrecorded_launch_us']:.1f} µs" in meta
    assert_no_js_errors(browser)


def test_running_values_say_whose_rows_they_are(browser, tmp_path):
    """FlashAttention-2's m and l are labelled with the Q tile and query rows they belong to and the K/V tile folded in
    last; a step without a score tile (the backward's dK) with its program."""
    from selenium.webdriver.common.by import By
    t = trace("fa2", seqlen=8, head_dim=4, block_m=2, block_n=2, causal=False)
    open_page(browser, tmp_path, render(t), "state")
    last = max(i for i, s in enumerate(t.steps) if s.state and s.pair == (1, 2))
    scrub_to(browser, last + 1)
    state = browser.find_element(By.ID, "state").text
    assert "of Q tile 1 (rows 2–3), after K tile 2 (rows 4–5):" in state and "m = [" in state
    t = trace("fa2_bwd", seqlen=8, head_dim=4, block_m=2, block_n=2, causal=False)
    open_page(browser, tmp_path, render(t), "state-bwd")
    first = min(i for i, s in enumerate(t.steps) if "dK" in s.state)
    scrub_to(browser, first + 1)
    assert browser.find_element(By.ID, "state").text.split("\n")[1] == t.steps[first].program + ":"
    assert_no_js_errors(browser)
