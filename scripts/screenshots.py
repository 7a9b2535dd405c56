"""Screenshots of each visualization page for the docs (headless Chromium):
    python scripts/screenshots.py  ->  docs/viz-<algo>.png (each of PAGES), docs/viz-playground.png,
    docs/viz-pipeline.png (the shipped trace of the sm90 forward)"""
import tempfile
from pathlib import Path

from selenium import webdriver
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By

from flashtile.trace import trace
from flashtile.viz import pipeline, playground, render

DOCS = Path(__file__).resolve().parents[1] / "docs"
PAGES = {"naive": (False, 20), "softmax": (False, 12), "fa1": (True, 25), "fa2": (True, 14), "fa2_bwd": (True, 40),
         "decode": (False, 14)}


def main():
    options = webdriver.ChromeOptions()
    for flag in ("--headless=new", "--no-sandbox", "--disable-gpu", "--no-first-run", "--disable-background-networking",
                 "--window-size=1400,900"):
        options.add_argument(flag)
    options.binary_location = "/usr/bin/chromium"
    driver = webdriver.Chrome(service=Service("/usr/bin/chromedriver"), options=options)
    with tempfile.TemporaryDirectory() as tmp:
        for algo, (causal, steps) in PAGES.items():
            page = Path(tmp) / f"{algo}.html"
            page.write_text(render(trace(algo, 8, 4, 2, 2, causal)))
            driver.get(page.as_uri())
            for _ in range(steps):
                driver.find_element(By.ID, "next").click()
            driver.save_screenshot(str(DOCS / f"viz-{algo}.png"))
        page = Path(tmp) / "playground.html"
        page.write_text(playground())
        driver.get(page.as_uri())
        driver.find_element(By.ID, "causal").click()
        driver.find_element(By.ID, "S-3-1").click()
        driver.save_screenshot(str(DOCS / "viz-playground.png"))
        page = Path(tmp) / "pipeline.html"
        page.write_text(pipeline.render(pipeline.load()))
        driver.get(page.as_uri())
        driver.save_screenshot(str(DOCS / "viz-pipeline.png"))
    driver.quit()


if __name__ == "__main__":
    main()
