#!/usr/bin/env python3
"""Drives the daemon's web console in a real browser, as an operator would: Debian's headless
Chromium through Selenium with Debian's chromedriver, both named explicitly (nothing is
downloaded). Used by tests/it/broker/control.rs.

Reads one JSON document on stdin:
{
  "url": "http://127.0.0.1:9464",          # the daemon's admin listener
  "token": "...",                           # an act token
  "trigger": "it/main",                     # the trigger whose parked key is skipped
  "offset": 0,                              # the parked record's offset
  "reason": "poison record",                # the skip's reason
  "screenshot": "/path/region.png",         # where the region view's screenshot goes
  "read_token": "..."                       # optional: a read token, whose buttons must be disabled
}

Prints {"parked_seen": true, "read_only_disabled": true|null, "message": "...", "gone": true,
"screenshot": "..."} or fails with a message on stderr.
"""
import json
import os
import sys
import tempfile

from selenium import webdriver
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By
from selenium.webdriver.support import expected_conditions as EC
from selenium.webdriver.support.ui import WebDriverWait

CHROMIUM = os.environ.get("TESSEL_CHROMIUM", "/usr/bin/chromium")
CHROMEDRIVER = os.environ.get("TESSEL_CHROMEDRIVER", "/usr/bin/chromedriver")


def browser(profile):
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for flag in ["--headless=new", "--no-sandbox", "--disable-gpu", "--disable-quic",
                 "--no-first-run", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync", "--disable-dev-shm-usage",
                 "--window-size=1500,720", f"--user-data-dir={profile}"]:
        options.add_argument(flag)
    return webdriver.Chrome(service=Service(executable_path=CHROMEDRIVER), options=options)


def use_token(driver, wait, url, token):
    driver.get(url + "/console")
    field = wait.until(EC.presence_of_element_located((By.ID, "token")))
    field.clear()
    field.send_keys(token)
    driver.find_element(By.ID, "use-token").click()


def main():
    spec = json.load(sys.stdin)
    url, trigger, offset = spec["url"].rstrip("/"), spec["trigger"], spec["offset"]
    out = {"parked_seen": False, "read_only_disabled": None, "gone": False}
    with tempfile.TemporaryDirectory(prefix="tessel-console-") as profile:
        driver = browser(profile)
        try:
            wait = WebDriverWait(driver, 30, poll_frequency=0.1)
            if spec.get("read_token"):
                # A read token sees the parked key, and its buttons are disabled.
                use_token(driver, wait, url, spec["read_token"])
                wait.until(EC.text_to_be_present_in_element((By.ID, "who"), "(read)"))
                row = f'tr[data-trigger="{trigger}"]'
                wait.until(EC.presence_of_element_located((By.CSS_SELECTOR, row))).click()
                skip = f'tr.parked-row[data-offset="{offset}"] button.skip'
                button = wait.until(EC.presence_of_element_located((By.CSS_SELECTOR, skip)))
                out["read_only_disabled"] = (not button.is_enabled()
                                             and not driver.find_element(By.ID, "pause").is_enabled())
                driver.execute_script("sessionStorage.clear(); location.hash = '';")
            use_token(driver, wait, url, spec["token"])
            wait.until(EC.text_to_be_present_in_element((By.ID, "who"), "(act)"))
            # The region at a glance: the trigger's row, its parked key counted.
            cell = f'tr[data-trigger="{trigger}"] td.parked-count'
            wait.until(EC.text_to_be_present_in_element((By.CSS_SELECTOR, cell), "1"))
            # Let a second refresh draw the lag chart's next point before the picture.
            wait.until(lambda d: d.execute_script(
                "return document.querySelectorAll('#region-table svg.spark polyline').length") >= 1)
            driver.save_screenshot(spec["screenshot"])
            out["screenshot"] = spec["screenshot"]
            # The trigger's page: the parked key with its last answer; skip it.
            driver.find_element(By.CSS_SELECTOR, f'tr[data-trigger="{trigger}"]').click()
            parked = f'tr.parked-row[data-offset="{offset}"]'
            row = wait.until(EC.presence_of_element_located((By.CSS_SELECTOR, parked)))
            out["parked_seen"] = True
            out["parked_row"] = row.text
            row.find_element(By.CSS_SELECTOR, "button.skip").click()
            reason = wait.until(EC.visibility_of_element_located((By.ID, "confirm-reason")))
            reason.send_keys(spec["reason"])
            driver.find_element(By.ID, "confirm-ok").click()
            wait.until(EC.text_to_be_present_in_element((By.ID, "message"), "skip:"))
            out["message"] = driver.find_element(By.ID, "message").text
            wait.until(EC.invisibility_of_element_located((By.CSS_SELECTOR, parked)))
            out["gone"] = True
        except Exception as e:  # noqa: BLE001 (the test wants the page as it was)
            sys.stderr.write(f"console check failed: {e!r}\npage:\n{driver.page_source[:4000]}\n")
            sys.exit(1)
        finally:
            driver.quit()
    print(json.dumps(out))


if __name__ == "__main__":
    main()
